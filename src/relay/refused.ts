import { MailroomError } from '../errors.ts';

/**
 * Thrown by a relay target's `publish` when one event of the batch can never
 * be delivered as it is: larger than the broker accepts, a type that is no
 * valid subject, a message the broker rejects for its content. Anything else
 * a target throws is a failure to retry (the broker is down, a timeout).
 *
 * By default the relay then parks the event (records it in `relay_parked`
 * with `reason`, moves the target's cursor past it) and delivers the events
 * after it; with `relay({ onRefused: 'hold' })` it retries the batch instead,
 * holding every later event back until the cause is fixed. The events of the
 * batch before the refused one may have been delivered already: they are sent
 * again, and brokers and consumers deduplicate them on the event id.
 *
 * @example
 * const audit: RelayTarget = {
 *   name: 'audit',
 *   async publish(events) {
 *     for (const event of events) {
 *       if ((event.body?.length ?? 0) > 65_536) throw new RefusedEventError(event.envelope.id, 'larger than the audit log takes (64 KiB)');
 *       await auditLog.append(event.envelope);
 *     }
 *   },
 * };
 */
export class RefusedEventError extends MailroomError {
  override name = 'RefusedEventError';

  constructor(
    /** The refused event's id (its envelope's `id`). */
    readonly eventId: string,
    /** Why, in the target's words: kept with the parked event. */
    readonly reason: string,
    options?: ErrorOptions,
  ) {
    super(`event ${eventId} was refused: ${reason}`, options);
  }
}
