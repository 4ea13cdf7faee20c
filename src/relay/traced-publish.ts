import { failed, startBatchSpan } from '../observe/tracing.ts';
import { storedRowOf } from './stored-event.ts';
import type { RelayContext, RelayedEvent, RelayTarget } from './target.ts';

/**
 * A target's publish of one batch inside a `relay <target>` span, linked to
 * the traces the batch's events were published in (a batch serves many
 * traces, so it links to them rather than joining one).
 */
export async function publishTraced(target: RelayTarget, events: readonly RelayedEvent[], context: RelayContext): Promise<void> {
  const span = startBatchSpan(
    `relay ${target.name}`,
    'producer',
    events.map((e) => storedRowOf(e).traceparent),
    { 'messaging.system': 'mailroom', 'messaging.destination.name': target.name, 'messaging.batch.message_count': events.length },
  );
  try {
    await target.publish(events, context);
  } catch (error) {
    failed(span, error);
    throw error;
  } finally {
    span.end();
  }
}
