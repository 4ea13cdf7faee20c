/**
 * The target's stream: looked up, and declared when it is missing and the
 * target may declare it.
 */
import { JetStreamApiCodes, JetStreamApiError, StorageType, type JetStreamManager, type StreamInfo } from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import { describeServers, reason } from './connect.ts';
import type { ResolvedNatsTargetOptions } from './options.ts';

/** The shortest duplicate window a declared stream gets: the server's own default. */
export const MIN_DUPLICATE_WINDOW_MS = 120_000;

/** The stream's info, or null when it does not exist. */
export async function streamInfoOrNull(jsm: JetStreamManager, stream: string): Promise<StreamInfo | null> {
  try {
    return await jsm.streams.info(stream);
  } catch (error) {
    if (error instanceof JetStreamApiError && error.code === JetStreamApiCodes.StreamNotFound) return null;
    throw error;
  }
}

/** The command that creates the stream as the target would, for error messages and docs. */
export function streamAddCommand(options: ResolvedNatsTargetOptions): string {
  return `nats stream add ${options.stream} --subjects '${options.subjectPrefix}.>' --storage file --dupe-window 2m --defaults`;
}

/**
 * Makes sure the target's stream exists: creates it (subjects `<prefix>.>`,
 * file storage, a duplicate window of `duplicateWindowMs`, at least 2
 * minutes) when `declare` is on, and otherwise rejects saying how to create it.
 * An existing stream is left as it is (its settings are `check()`'s business).
 *
 * @example
 * await ensureStream(jsm, resolveTargetOptions({ url, stream: 'orders' }), 120_000);
 */
export async function ensureStream(jsm: JetStreamManager, options: ResolvedNatsTargetOptions, duplicateWindowMs: number): Promise<void> {
  if (await streamInfoOrNull(jsm, options.stream)) return;
  const where = describeServers(options.servers);
  if (!options.declare) {
    throw new Error(`nats: stream ${options.stream} does not exist on ${where} and the target has declare: false; create it (${streamAddCommand(options)}) or set declare: true`);
  }
  try {
    await jsm.streams.add({
      name: options.stream,
      subjects: [`${options.subjectPrefix}.>`],
      storage: StorageType.File,
      duplicate_window: nanos(Math.max(MIN_DUPLICATE_WINDOW_MS, duplicateWindowMs)),
    });
  } catch (error) {
    // Another relay may have declared it at the same moment.
    if (await streamInfoOrNull(jsm, options.stream)) return;
    throw new Error(`nats: cannot create stream ${options.stream} (subjects '${options.subjectPrefix}.>') on ${where}: ${reason(error)}`, { cause: error });
  }
}
