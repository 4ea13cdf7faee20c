/** Text for people of `mailroom dlq`: the list table, one dead letter, and the summary of a replay or discard. */
import type { DeadLetter, DeadLetterDetail } from '../dead-letters/dead-letter.ts';
import type { DiscardResult, ReplayResult } from '../dead-letters/replay.ts';
import { formatTime, table } from './format.ts';

const MESSAGE_WIDTH = 60;

function oneLine(text: string | null, width: number): string {
  const flat = (text ?? '').replace(/\s+/g, ' ').trim();
  return flat.length > width ? `${flat.slice(0, width - 1)}…` : flat;
}

/** A page of dead letters as a table, newest first, with how to get the next page. */
export function listText(items: readonly DeadLetter[], next: string | null, where: string): string {
  if (items.length === 0) return `No dead letters match in ${where}.\n`;
  const owners = items.some((d) => d.owner !== null);
  const columns = [
    { heading: 'died' },
    { heading: 'id' },
    { heading: 'queue' },
    ...(owners ? [{ heading: 'owner' }] : []),
    { heading: 'type' },
    { heading: 'category' },
    { heading: 'attempts', right: true },
    { heading: 'message' },
  ];
  const rows = items.map((d) => [
    formatTime(d.diedAt),
    d.id,
    d.queue,
    ...(owners ? [d.owner ?? ''] : []),
    d.type,
    d.reason && d.reason !== d.category ? `${d.category} (${d.reason})` : d.category,
    `${d.attempts}/${d.maxAttempts}`,
    oneLine(d.message, MESSAGE_WIDTH),
  ]);
  let out = `${items.length} dead letter${items.length === 1 ? '' : 's'} in ${where}, newest first:\n${table(columns, rows)}`;
  if (next !== null) out += `More: run the same command with --cursor ${next}\n`;
  return out;
}

function field(label: string, value: string | null): string {
  return value === null || value === '' ? '' : `  ${label.padEnd(14)}${value}\n`;
}

/** One dead letter: what it is, why it died, its payload (redacted) and its history. */
export function showText(letter: DeadLetterDetail): string {
  let out = `Dead letter ${letter.id}\n`;
  out += field('queue', letter.owner ? `${letter.queue} (owner ${letter.owner})` : letter.queue);
  out += field('type', letter.type);
  out += field('category', letter.category);
  out += field('reason', letter.reason);
  out += field('message', letter.message);
  out += field('attempts', `${letter.attempts} of ${letter.maxAttempts}`);
  out += field('correlation id', letter.correlationId);
  out += field('key', letter.key);
  out += field('ordering key', letter.orderingKey);
  out += field('first seen', formatTime(letter.firstSeenAt));
  out += field('died', formatTime(letter.diedAt));
  out += '\nHistory\n';
  out += table(
    [{ heading: 'at' }, { heading: 'event' }, { heading: 'attempt', right: true }, { heading: 'detail' }],
    letter.history.map((h) => [formatTime(h.at), h.event, h.attempt === undefined ? '' : String(h.attempt), oneLine(h.detail ?? h.worker ?? '', 100)]),
  );
  if (letter.errors.length > 0) {
    out += '\nErrors\n';
    out += table(
      [{ heading: 'attempt', right: true }, { heading: 'at' }, { heading: 'category' }, { heading: 'worker' }, { heading: 'message' }],
      letter.errors.map((e) => [String(e.attempt), formatTime(e.at), e.category, e.worker ?? '', oneLine(e.message, 100)]),
    );
  }
  out += `\nPayload\n${(JSON.stringify(letter.data, null, 2) ?? 'null').replace(/^/gm, '  ')}\n`;
  out += `\nReplay it: mailroom dlq replay --id ${letter.id}    Discard it: mailroom dlq discard --id ${letter.id}\n`;
  return out;
}

/** The summary of a replay or discard: numbers first, then what to do next. */
export function summaryText(action: 'replay' | 'discard', result: ReplayResult | DiscardResult, by: string | undefined, where: string): string {
  const done = 'replayed' in result ? result.replayed : result.discarded;
  const verb = action === 'replay' ? 'replayed' : 'discarded';
  const title = result.dryRun ? `Dry run of a ${action} in ${where}: nothing was changed` : `${action === 'replay' ? 'Replay' : 'Discard'} in ${where}`;
  let out = `${title}\n`;
  out += field('matched', String(result.matched));
  out += field(result.dryRun ? `would ${action}` : verb, String(result.dryRun ? result.matched - ('skipped' in result ? result.skipped : 0) : done));
  if ('skipped' in result && result.skipped > 0) out += field('skipped', `${result.skipped} (an unfinished job holds their dedup key; replay them once it is done)`);
  out += field('replay id', result.replayId);
  out += field('by', by ?? null);
  out += field('interrupted', String(result.interrupted));
  for (const id of result.notFound ?? []) out += `  not found: ${id} (no dead letter with this id)\n`;
  if (result.interrupted) out += `Interrupted after ${done} of ${result.matched}; run the same command again to ${action} the rest (nothing was ${verb} twice).\n`;
  return out;
}
