/**
 * A target refused one event of a batch for good (`RefusedEventError`): with
 * `onRefused: 'park'` the event is parked and the next round (at once) sends
 * the batch without it; with `'hold'`, or when the target named an event it
 * was not given, the refusal is a failed round like any other (retried with
 * backoff).
 */
import { MailroomError } from '../errors.ts';
import type { OutboxPoint } from './read-batch.ts';
import type { RefusedEventError } from './refused.ts';
import type { Round, RoundHost, TargetState } from './round-state.ts';
import { storedRowOf } from './stored-event.ts';
import type { RelayedEvent } from './target.ts';

/** Parks the refused event of `events` (or throws, see above); the round that ends is `done` at `cursor`, or `lost`. */
export async function refusedRound(host: RoundHost, s: TargetState, token: string, error: RefusedEventError, events: readonly RelayedEvent[], fence: bigint, cursor: OutboxPoint): Promise<Round> {
  const name = s.target.name;
  const event = events.find((e) => storedRowOf(e).id === error.eventId);
  if (event === undefined) {
    throw new MailroomError(
      `relay target ${name} refused event ${error.eventId}, which is not in the batch it was given (${events.length} events from position ${events[0]?.position ?? '-'}); the batch is retried. A RefusedEventError must name an event of the batch by its envelope id`,
      { cause: error },
    );
  }
  if (host.options.onRefused === 'hold') {
    throw new MailroomError(
      `relay target ${name} refused event ${error.eventId} (position ${event.position}): ${error.reason}; with onRefused: 'hold' the relay retries it and delivers nothing after it to this target until the cause is fixed`,
      { cause: error },
    );
  }
  const parked = await s.parked.park(event, error.reason, host.id, token);
  if (parked === 'lost') return { kind: 'lost' };
  if (parked === 'again') {
    throw new MailroomError(`relay target ${name} refused event ${error.eventId} (position ${event.position}) again after it was parked: ${error.reason}`, { cause: error });
  }
  const type = storedRowOf(event).type;
  const info = { target: name, eventId: error.eventId, type, position: event.position, reason: error.reason };
  if (!host.tell('parked', info)) {
    console.error(`[mailroom] relay ${host.id}: target ${name} refused event ${info.eventId} (${type}, position ${info.position}) for good; parked (see mailroom parked list ${name}): ${info.reason}`);
  }
  return { kind: 'done', delivered: 0, exhausted: false, blockedBy: null, fence, cursor };
}
