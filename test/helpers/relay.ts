import type { Mailroom, Relay, RelayFlushResult } from '../../src/index.ts';

/**
 * Flushes `relay` until `expected` events in all were delivered to `target`.
 * On a shared PostgreSQL server another test's open transaction can hold the
 * fence for a moment (as it would hold a real relay back): this waits it out.
 * A fence held longer fails with the relay's own report of who holds it.
 */
export async function flushUntil(relay: Relay, expected: number, target = 'internal', timeoutMs = 15_000, mailroom?: Mailroom): Promise<RelayFlushResult> {
  const total: RelayFlushResult = { delivered: 0, heldBack: false, leased: true };
  const deadline = Date.now() + timeoutMs;
  let heldBy: unknown = null;
  relay.on('held-back', (info) => (heldBy = info.heldBackBy));
  for (;;) {
    const result = (await relay.flush())[target];
    if (!result) throw new Error(`relay has no target ${target}`);
    total.delivered += result.delivered;
    total.heldBack = result.heldBack;
    total.leased = result.leased;
    if (total.delivered > expected) throw new Error(`delivered ${total.delivered} events to ${target}, expected ${expected}`);
    if (total.delivered === expected) return total;
    if (Date.now() > deadline) {
      const stats = mailroom ? (await mailroom.stats()).relay[target] : undefined;
      throw new Error(
        `timed out after ${timeoutMs} ms with ${total.delivered} of ${expected} events delivered to ${target}; held back by ${JSON.stringify(stats?.heldBackBy ?? heldBy)} ` +
          '(a long-open transaction anywhere on the server, e.g. a benchmark, holds every relay back)',
      );
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
