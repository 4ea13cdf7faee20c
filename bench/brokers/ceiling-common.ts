/** What the three broker ceilings share: their options, their result, and the timed loop of batches. */
import { now } from '../stats.ts';

export interface CeilingOptions {
  url: string;
  messages: number;
  /** Body size in bytes. Default 300 (about a small CloudEvents document). */
  bodyBytes?: number;
  /** Transport headers on every message (as the relay sends: `partitionkey`, `traceparent`, …). Default none. */
  headers?: Record<string, string>;
}

export interface CeilingResult {
  perSecond: number;
  messages: number;
  seconds: number;
}

/** Messages per batch: publish them all, then wait for every confirm. */
export const CEILING_BATCH = 100;

/** Publishes `messages` in batches of {@link CEILING_BATCH} with `publishBatch(n)` and times it. */
export async function timeBatches(messages: number, publishBatch: (count: number) => Promise<void>): Promise<CeilingResult> {
  if (!Number.isInteger(messages) || messages < 1) throw new Error(`ceiling: messages must be a positive integer, got ${messages}`);
  const started = now();
  for (let sent = 0; sent < messages; ) {
    const n = Math.min(CEILING_BATCH, messages - sent);
    await publishBatch(n);
    sent += n;
  }
  const seconds = (now() - started) / 1000;
  return { perSecond: messages / seconds, messages, seconds };
}
