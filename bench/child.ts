/**
 * One measurement in a fresh process: the runner forks this file for each
 * (system, workload), so no system's timers, pools or JIT state leak into the
 * next one's figures. It receives a Task, answers with a TaskAnswer, and exits.
 */
import { makeAdapter, type SystemId } from './adapters/index.ts';
import type { AdapterContext } from './adapters/types.ts';
import { ceiling, type CeilingParams, type CeilingResult } from './workloads/ceiling.ts';
import { drain, type DrainParams, type DrainResult } from './workloads/drain.ts';
import { enqueue, type EnqueueParams, type EnqueueResult } from './workloads/enqueue.ts';
import { latency, type LatencyParams, type LatencyResult } from './workloads/latency.ts';
import { scale, type ScaleParams, type ScaleResult } from './workloads/scale.ts';

export type Task =
  | { kind: 'drain'; system: SystemId; ctx: AdapterContext; params: DrainParams }
  | { kind: 'enqueue'; system: SystemId; ctx: AdapterContext; params: EnqueueParams }
  | { kind: 'latency'; system: SystemId; ctx: AdapterContext; params: LatencyParams }
  | { kind: 'scale'; params: ScaleParams }
  | { kind: 'ceiling'; params: CeilingParams };

export type TaskResult = DrainResult | EnqueueResult | LatencyResult | ScaleResult | CeilingResult;
export type TaskAnswer = { ok: true; result: TaskResult } | { ok: false; error: string };

function answer(a: TaskAnswer): Promise<void> {
  return new Promise((resolve) => process.send!(a, undefined, {}, () => resolve()));
}

function describeError(error: unknown): string {
  return error instanceof Error ? (error.stack ?? error.message) : String(error);
}

/** Measures, answers, then cleans up: a failure while cleaning up cannot lose a measurement already made. */
async function perform(task: Task): Promise<void> {
  if (task.kind === 'scale' || task.kind === 'ceiling') {
    const result = await (task.kind === 'scale' ? scale(task.params) : ceiling(task.params)).then(
      (r): TaskAnswer => ({ ok: true, result: r }),
      (e: unknown): TaskAnswer => ({ ok: false, error: describeError(e) }),
    );
    await answer(result);
    return;
  }
  const adapter = makeAdapter(task.system, task.ctx);
  let result: TaskAnswer;
  try {
    await adapter.setup();
    const value =
      task.kind === 'drain' ? await drain(adapter, task.params) : task.kind === 'enqueue' ? await enqueue(adapter, task.params) : await latency(adapter, task.params);
    result = { ok: true, result: value };
  } catch (error) {
    result = { ok: false, error: describeError(error) };
  }
  await answer(result);
  await adapter.teardown().catch((error: unknown) => console.error(`[bench] ${task.system}: teardown failed:`, error));
}

if (!process.send) {
  console.error('this is a process of `npm run bench`; it is not meant to be started by hand');
  process.exit(2);
}
process.once('message', (task: Task) => {
  void perform(task).finally(() => process.exit(0));
});
