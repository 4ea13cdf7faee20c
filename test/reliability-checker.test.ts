/**
 * The reliability suite's own tools, tested on their own: the history checker
 * on hand-made histories (a clean one, then each kind of violation), and the
 * TCP fault proxy against a local echo server (forwarding, latency, resets,
 * a black hole and its recovery).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, connect, type Socket } from 'node:net';
import { once } from 'node:events';
import { FaultProxy } from './reliability/fault-proxy.ts';
import { OpLog, checkHistory, type Effect, type History, type JobRecord, type Op, type Run } from './reliability/history.ts';

// ---------------------------------------------------------------------------
// Hand-made histories
// ---------------------------------------------------------------------------

let nextEffect = 1;

/** A history builder: operations, and for each delivery its run, effect and job. */
function history(): {
  op(id: string, outcome: Op['outcome'], extra?: Partial<Op>): Op;
  /** A run of `op` at `dest` by `attempt`; with `effect` it also took effect (in this order). */
  run(op: string, dest: string, attempt: number, options?: { effect?: boolean; job?: string; key?: string | null; seq?: number | null }): void;
  /** The job's final state (default: completed by the last attempt that ran). */
  job(id: string, record: Partial<JobRecord>): void;
  rescue(job: string, attempt: number): void;
  build(): History;
} {
  const h: History = { ops: [], runs: [], effects: [], jobs: [], rescued: [] };
  const jobs = new Map<string, JobRecord>();
  return {
    op(id, outcome, extra = {}) {
      const op: Op = { id, kind: 'enqueue', destinations: ['rel'], key: null, seq: null, ...extra };
      if (outcome !== undefined) op.outcome = outcome;
      h.ops.push(op);
      return op;
    },
    run(op, dest, attempt, options = {}) {
      const jobId = options.job ?? `job-${op}-${dest}`;
      const run: Run = { id: `run-${h.runs.length}`, dest, op, job_id: jobId, attempt, pid: 100 };
      h.runs.push(run);
      const known = h.ops.find((o) => o.id === op);
      if (options.effect) {
        const effect: Effect = {
          id: nextEffect++,
          run_id: run.id,
          dest,
          op,
          key: options.key !== undefined ? options.key : (known?.key ?? null),
          seq: options.seq !== undefined ? options.seq : (known?.seq ?? null),
          job_id: jobId,
          attempt,
          pid: 100,
        };
        h.effects.push(effect);
      }
      const job = jobs.get(jobId) ?? { id: jobId, queue: dest, state: 'completed', attempt, claim_count: attempt };
      if (options.effect || attempt > job.attempt) Object.assign(job, { state: 'completed', attempt, claim_count: attempt });
      jobs.set(jobId, job);
    },
    job(id, record) {
      jobs.set(id, { ...(jobs.get(id) ?? { id, queue: 'rel', state: 'completed', attempt: 1, claim_count: 1 }), ...record });
    },
    rescue(job, attempt) {
      h.rescued.push({ job_id: job, claim: attempt, attempt });
    },
    build() {
      return { ...h, jobs: [...jobs.values()] };
    },
  };
}

/** A clean history with every outcome, retries, redeliveries and ordered keys. */
function cleanHistory() {
  const h = history();
  h.op('a', 'ok', { key: 'k', seq: 0 });
  h.op('b', 'ok', { key: 'k', seq: 1 });
  h.op('c', 'ok', { kind: 'publish', destinations: ['g1', 'g2'], key: 'e', seq: 0 });
  h.op('d', 'rolled-back');
  h.op('e', 'failed', { error: 'connection terminated' });
  h.op('u1', 'unknown');
  h.op('u2', 'unknown');
  h.run('a', 'rel', 1); // failed first: no effect
  h.run('a', 'rel', 2, { effect: true });
  h.run('b', 'rel', 1, { effect: true });
  h.run('c', 'g1', 1, { effect: true });
  h.run('c', 'g2', 1); // killed mid-run, rescued, run again
  h.rescue('job-c-g2', 1);
  h.run('c', 'g2', 2, { effect: true });
  h.run('u1', 'rel', 1, { effect: true }); // an unknown op that committed after all
  return h;
}

describe('history checker', () => {
  it('a clean history passes: retries and redeliveries are counted, unknown operations may or may not apply', () => {
    const report = checkHistory(cleanHistory().build());
    assert.equal(report.ok, true, JSON.stringify(report.violations));
    assert.deepEqual(report.ops, { ok: 3, failed: 1, 'rolled-back': 1, unknown: 2 });
    assert.equal(report.expected, 4); // a, b, and c at two groups
    assert.equal(report.effects, 5);
    assert.equal(report.duplicateDeliveries, 2);
    assert.equal(report.unknownApplied, 1);
    assert.equal(report.unknownNotApplied, 1);
    assert.deepEqual(report.violations, []);
  });

  it('lost: a committed operation without an effect at one of its destinations', () => {
    const h = cleanHistory();
    h.op('f', 'ok', { kind: 'publish', destinations: ['g1', 'g2'], key: 'e', seq: 1 });
    h.run('f', 'g1', 1, { effect: true });
    h.run('f', 'g2', 1); // ran, never took effect, never ran again
    const report = checkHistory(h.build());
    assert.equal(report.ok, false);
    assert.equal(report.lost, 1);
    assert.deepEqual(report.violations.map((v) => [v.kind, v.op, v.dest]), [['lost', 'f', 'g2']]);
    assert.match(report.violations[0]!.detail, /runs: 1/);
  });

  it('an operation never settled counts as unknown, not lost', () => {
    const h = cleanHistory();
    h.op('pending', undefined);
    const report = checkHistory(h.build());
    assert.equal(report.ok, true);
    assert.equal(report.ops.unknown, 3);
  });

  it('duplicated: two effects of one operation at one destination, also of an unknown operation', () => {
    const h = cleanHistory();
    h.run('b', 'rel', 2, { effect: true, job: 'job-b-again' });
    h.run('u2', 'rel', 1, { effect: true, job: 'u2-1' });
    h.run('u2', 'rel', 1, { effect: true, job: 'u2-2' });
    const report = checkHistory(h.build());
    assert.equal(report.duplicated, 2);
    assert.deepEqual(report.violations.filter((v) => v.kind === 'duplicated').map((v) => v.op).sort(), ['b', 'u2']);
  });

  it('unexpected: an effect of an operation never invoked, or at a destination it was not sent to', () => {
    const h = cleanHistory();
    h.run('ghost', 'rel', 1, { effect: true });
    h.run('a', 'g1', 1, { effect: true, job: 'a-elsewhere' });
    const report = checkHistory(h.build());
    assert.equal(report.unexpected, 2);
    assert.deepEqual(report.violations.filter((v) => v.kind === 'unexpected').map((v) => [v.op, v.dest]), [['ghost', 'rel'], ['a', 'g1']]);
  });

  it('effects of rolled-back work: rolled back on purpose, or failed before COMMIT', () => {
    const h = cleanHistory();
    h.run('d', 'rel', 1, { effect: true });
    h.run('e', 'rel', 1, { effect: true });
    const report = checkHistory(h.build());
    assert.equal(report.rolledBack, 2);
    const details = report.violations.filter((v) => v.kind === 'rolled-back').map((v) => v.detail);
    assert.match(details[0]!, /^rolled-back enqueue took effect 1 time/);
    assert.match(details[1]!, /^failed enqueue .*connection terminated/);
  });

  it('order: a key\'s committed operations taking effect out of invocation order; unknown ones are not ordered', () => {
    const h = history();
    h.op('k0', 'ok', { key: 'k', seq: 0 });
    h.op('k1', 'unknown', { key: 'k', seq: 1 });
    h.op('k2', 'ok', { key: 'k', seq: 2 });
    h.op('k3', 'ok', { key: 'k', seq: 3 });
    h.op('other', 'ok', { key: 'z', seq: 0 });
    h.run('k0', 'rel', 1, { effect: true });
    h.run('k3', 'rel', 1, { effect: true });
    h.run('other', 'rel', 1, { effect: true });
    h.run('k2', 'rel', 1, { effect: true }); // after k3: a violation
    h.run('k1', 'rel', 1, { effect: true }); // unknown: its commit may have been late, not a violation
    const report = checkHistory(h.build());
    assert.equal(report.orderViolations, 1);
    assert.equal(report.duplicated + report.lost + report.unexpected + report.staleCompletions, 0);
    assert.match(report.violations[0]!.detail, /key k: seq 2 .* after seq 3/);
  });

  it('order is per destination: each consumer group keeps its own order', () => {
    const h = history();
    h.op('e0', 'ok', { kind: 'publish', destinations: ['g1', 'g2'], key: 'e', seq: 0 });
    h.op('e1', 'ok', { kind: 'publish', destinations: ['g1', 'g2'], key: 'e', seq: 1 });
    h.run('e0', 'g1', 1, { effect: true });
    h.run('e1', 'g2', 1, { effect: true });
    h.run('e1', 'g1', 1, { effect: true });
    h.run('e0', 'g2', 1, { effect: true }); // g2 saw seq 0 after seq 1
    const report = checkHistory(h.build());
    assert.equal(report.orderViolations, 1);
    assert.equal(report.violations[0]!.dest, 'g2');
  });

  it('stale completions: an effect from a claim that was taken over, or not the claim that completed the job', () => {
    const taken = cleanHistory();
    taken.op('s', 'ok');
    taken.run('s', 'rel', 1, { effect: true }); // committed although its lease was taken over ...
    taken.rescue('job-s-rel', 1);
    const r1 = checkHistory(taken.build());
    assert.equal(r1.staleCompletions, 1);
    assert.match(r1.violations[0]!.detail, /lease had expired and was taken over/);

    const other = cleanHistory();
    other.op('s', 'ok');
    other.run('s', 'rel', 1, { effect: true });
    other.job('job-s-rel', { attempt: 2, claim_count: 2 }); // ... or the job was completed by a later attempt
    const r2 = checkHistory(other.build());
    assert.equal(r2.staleCompletions, 1);
    assert.match(r2.violations[0]!.detail, /committed by attempt 1; the job was completed by attempt 2/);

    const notDone = cleanHistory();
    notDone.op('s', 'ok');
    notDone.run('s', 'rel', 1, { effect: true });
    notDone.job('job-s-rel', { state: 'retrying' }); // an effect commits only with the completion
    assert.equal(checkHistory(notDone.build()).staleCompletions, 1);
  });

  it('OpLog: invoked operations get ids and are settled exactly once', () => {
    const log = new OpLog('t');
    const a = log.invoke({ kind: 'enqueue', destinations: ['rel'], key: 'k', seq: 0 });
    const b = log.invoke({ kind: 'publish', destinations: ['g1'], key: 'k', seq: 1 });
    assert.notEqual(a.id, b.id);
    assert.equal(a.outcome, undefined);
    log.settle([a, b], 'unknown', new Error('Connection terminated unexpectedly'));
    assert.equal(b.outcome, 'unknown');
    assert.equal(b.error, 'Connection terminated unexpectedly');
    assert.throws(() => log.settle([a], 'ok'), /already settled as unknown/);
    assert.equal(log.ops().length, 2);
  });
});

// ---------------------------------------------------------------------------
// The fault proxy
// ---------------------------------------------------------------------------

/** A loopback echo server; resolves with its port and a closer. */
async function echoServer(): Promise<{ port: number; sockets: Set<Socket>; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
    socket.pipe(socket);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  return {
    port,
    sockets,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A client connected through the proxy that collects what it reads. */
async function client(port: number): Promise<{ socket: Socket; received: () => string; closed: Promise<Error | null> }> {
  const socket = connect({ host: '127.0.0.1', port });
  let data = '';
  socket.setEncoding('utf8');
  socket.on('data', (chunk: string) => (data += chunk));
  const closed = new Promise<Error | null>((resolve) => {
    let error: Error | null = null;
    socket.on('error', (e) => (error = e));
    socket.on('close', () => resolve(error));
  });
  await once(socket, 'connect');
  return { socket, received: () => data, closed };
}

async function until(check: () => boolean, timeoutMs = 3000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('fault proxy', () => {
  it('forwards both ways, adds latency in order, resets every connection with an error on the client', async (t) => {
    const echo = await echoServer();
    const proxy = await FaultProxy.start({ host: '127.0.0.1', port: echo.port });
    t.after(async () => {
      await proxy.close();
      await echo.close();
    });
    const c = await client(proxy.port);
    c.socket.write('hello');
    await until(() => c.received() === 'hello');

    proxy.latency(150);
    const t0 = Date.now();
    c.socket.write('a');
    c.socket.write('b');
    await until(() => c.received() === 'helloab');
    // Each direction holds the chunks 150 ms: about 300 ms for the round trip.
    assert.ok(Date.now() - t0 >= 280, `round trip took ${Date.now() - t0} ms with 150 ms latency each way`);
    proxy.heal();

    const other = await client(proxy.port);
    await until(() => proxy.stats().open === 2);
    assert.equal(proxy.resetAll(), 2);
    const [e1, e2] = await Promise.all([c.closed, other.closed]);
    assert.equal((e1 as NodeJS.ErrnoException | null)?.code, 'ECONNRESET');
    assert.equal((e2 as NodeJS.ErrnoException | null)?.code, 'ECONNRESET');
    await until(() => echo.sockets.size === 0);
    assert.deepEqual(proxy.stats(), { connections: 2, open: 0, reset: 2 });

    // The proxy itself keeps accepting after a reset.
    const again = await client(proxy.port);
    again.socket.write('back');
    await until(() => again.received() === 'back');
    again.socket.destroy();
  });

  it('a black hole stalls open and new connections without closing them; heal delivers what was held, in order', async (t) => {
    const echo = await echoServer();
    const proxy = await FaultProxy.start({ host: '127.0.0.1', port: echo.port });
    t.after(async () => {
      await proxy.close();
      await echo.close();
    });
    const open = await client(proxy.port);
    proxy.blackhole();
    open.socket.write('one');
    open.socket.write('two');
    const fresh = await client(proxy.port); // accepted, not refused
    fresh.socket.write('new');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(open.received(), '');
    assert.equal(fresh.received(), '');
    assert.equal(proxy.stats().open, 2);
    assert.equal(open.socket.destroyed, false);

    proxy.heal();
    await until(() => open.received() === 'onetwo' && fresh.received() === 'new');
    open.socket.destroy();
    fresh.socket.destroy();
  });

  it('a target that refuses connections looks like a reset to the client', async (t) => {
    const echo = await echoServer();
    const port = echo.port;
    await echo.close(); // nothing listens there now
    const proxy = await FaultProxy.start({ host: '127.0.0.1', port });
    t.after(() => proxy.close());
    const c = await client(proxy.port);
    const error = await c.closed;
    assert.ok(error === null || (error as NodeJS.ErrnoException).code === 'ECONNRESET', String(error));
  });
});
