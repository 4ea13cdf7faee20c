/** The ledger as text a person can read. */
import { CRASH_DESCRIPTION } from './fleet.ts';
import type { Ledger } from './ledger.ts';

const n = (value: number): string => value.toLocaleString('en-US');

const DEAD_REASON_TEXT: Record<string, string> = {
  permanent: 'the handler threw PermanentError (declined card)',
  'max-attempts': 'failed on every allowed attempt (partner API down)',
  'unknown-type': 'no worker has a handler for the job type',
  'max-age': 'older than its maxAge',
  validation: 'the payload failed validation',
};

function row(label: string, value: string, note = ''): string {
  return `  ${label.padEnd(22)}${value.padStart(8)}${note ? `   ${note}` : ''}`;
}

function list(record: Record<string, number>): string {
  const entries = Object.entries(record);
  return entries.length === 0 ? 'none' : entries.map(([k, v]) => `${k} ${n(v)}`).join(' · ');
}

function check(value: number): string {
  return value === 0 ? 'ok' : 'FAILED';
}

/** Splits the rescues between the crashed workers and live workers whose heartbeat came too late. */
function rescuedDetail(ledger: Ledger): string[] {
  const held = ledger.crashes.workers.reduce((sum, c) => sum + c.inFlight, 0);
  const late = ledger.rescued - held;
  if (late <= 0) return [];
  return [
    `      ${n(held)} held by the crashed workers; ${n(late)} by live workers whose heartbeat came late ` +
      `(a ${ledger.settings.lease} lease is short on a busy machine): their results were refused and the jobs ran again`,
  ];
}

/** Formats the ledger with a line per number and what it means. */
export function formatLedger(ledger: Ledger): string {
  const { settings: st } = ledger;
  const seconds = ledger.durationMs / 1000;
  const lines: string[] = [
    '',
    `mailroom demo ledger (counted from the database: schema ${ledger.schema} on ${ledger.database.location})`,
    `  ${n(st.jobs)} jobs · ${st.workers} workers × ${st.concurrency} at a time · lease ${st.lease} · took ${seconds.toFixed(1)}s`,
    '',
    row('enqueued', n(ledger.enqueued), 'each committed in one transaction with its demo_jobs row'),
    row('completed', n(ledger.completed), `planned ${n(ledger.expected.completed)}`),
    row('retried', n(ledger.retried.jobs), `jobs with more than one attempt; ${n(ledger.retried.retries)} retries in all`),
    row('failed attempts', n(Object.values(ledger.failures).reduce((a, b) => a + b, 0)), list(ledger.failures)),
    row('dead-lettered', n(ledger.deadLettered.total), `planned ${n(Object.values(ledger.expected.deadLettered).reduce((a, b) => a + b, 0))}`),
  ];
  const reasons = new Set([...Object.keys(ledger.expected.deadLettered), ...Object.keys(ledger.deadLettered.byCategory)]);
  for (const reason of reasons) {
    const got = ledger.deadLettered.byCategory[reason] ?? 0;
    const planned = ledger.expected.deadLettered[reason] ?? 0;
    lines.push(row(`  ${reason}`, n(got), `${DEAD_REASON_TEXT[reason] ?? ''}${got === planned ? '' : ` (planned ${n(planned)})`}`));
  }
  lines.push(row('workers crashed', n(ledger.crashes.count), `${CRASH_DESCRIPTION[ledger.crashes.kind]}`));
  for (const c of ledger.crashes.workers) {
    const who = c.pid === undefined ? `worker ${c.worker}` : `worker ${c.worker} (pid ${c.pid})`;
    lines.push(`      ${who} at ${(c.atMs / 1000).toFixed(1)}s with ${n(c.inFlight)} jobs in flight; ${c.replacement} took its place`);
  }
  lines.push(
    row('rescued', n(ledger.rescued), 'jobs whose lease expired, put back by maintenance and run again'),
    ...rescuedDetail(ledger),
    row('handler runs', n(ledger.runs.total), `${n(ledger.runs.jobsRunMoreThanOnce)} jobs whose handler ran more than once (at-least-once delivery)`),
    row('effects applied', n(ledger.effects.applied), 'written through ctx.tx, committed with the completion'),
    row('  applied twice', n(ledger.effects.duplicated), `${check(ledger.effects.duplicated)}: exactly-once effects despite the re-runs`),
    row('  missing', n(ledger.effects.missing), `${check(ledger.effects.missing)}: completed jobs without their effect`),
    ledger.stoppedEarly
      ? row('lost', '-', `not counted: the demo stopped early; ${n(ledger.lost)} jobs are still in the queue`)
      : row('lost', n(ledger.lost), `${check(ledger.lost)}: committed jobs neither completed nor dead-lettered`),
    row('run after completion', n(ledger.runAfterCompletion), `${check(ledger.runAfterCompletion)}: handler runs that started after their job had completed`),
    row('unexpected outcome', n(ledger.unexpected), `${check(ledger.unexpected)}: jobs that ended otherwise than planned`),
  );
  if (Object.keys(ledger.unfinished).length > 0) lines.push(`  still unfinished: ${list(ledger.unfinished)}`);
  if (ledger.stoppedEarly) lines.push(`  the demo was ${ledger.stoppedEarly === 'timeout' ? 'stopped by --timeout' : 'interrupted'} before every job finished`);
  lines.push(
    '',
    ledger.ok
      ? 'Every committed job was completed or dead-lettered with its reason; none was lost or run after it completed.'
      : ledger.stoppedEarly
        ? `Stopped early: run it again${ledger.stoppedEarly === 'timeout' ? ' with a longer --timeout' : ''} to see every job through.`
        : 'FAILED: see the lines marked FAILED above.',
    '',
  );
  return lines.join('\n');
}
