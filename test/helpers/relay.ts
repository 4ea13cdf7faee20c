import type { Mailroom, Relay, RelayFlushResult } from '../../src/index.ts';

/**
 * Flushes `relay` until `expected` events in all were delivered to `target`.
 * On a shared PostgreSQL server another test's open transaction can hold the
 * fence for a moment (as it would hold a real relay back): this waits it out.
 * A fence held longer fails with the relay's own report of who holds it.
 */
export async function flushUntil(relay: Relay, expected: number, target = 'internal', timeoutMs = 15_000, mailroom?: Mailroom): Promise<RelayFlushResult> {
  return (await flushEachUntil(relay, expected, [target], timeoutMs, mailroom))[target]!;
}

/**
 * {@link flushUntil} for several targets: flushes until each of `targets` got
 * `expected` events in all. A flush runs the targets' rounds one after the
 * other, so another test's transaction may hold one target back after the
 * other got through.
 */
export async function flushEachUntil(
  relay: Relay,
  expected: number,
  targets: readonly string[],
  timeoutMs = 15_000,
  mailroom?: Mailroom,
): Promise<Record<string, RelayFlushResult>> {
  const totals: Record<string, RelayFlushResult> = Object.fromEntries(targets.map((t) => [t, { delivered: 0, heldBack: false, leased: true }]));
  const deadline = Date.now() + timeoutMs;
  let heldBy: unknown = null;
  const onHeldBack = (info: { heldBackBy: unknown }) => void (heldBy = info.heldBackBy);
  relay.on('held-back', onHeldBack);
  try {
    for (;;) {
      const results = await relay.flush();
      for (const target of targets) {
        const result = results[target];
        if (!result) throw new Error(`relay has no target ${target}`);
        const total = totals[target]!;
        total.delivered += result.delivered;
        total.heldBack = result.heldBack;
        total.leased = result.leased;
        if (total.delivered > expected) throw new Error(`delivered ${total.delivered} events to ${target}, expected ${expected}`);
      }
      const short = targets.filter((t) => totals[t]!.delivered < expected);
      if (short.length === 0) return totals;
      if (Date.now() > deadline) {
        const stats = mailroom ? (await mailroom.stats()).relay[short[0]!] : undefined;
        throw new Error(
          `timed out after ${timeoutMs} ms with ${short.map((t) => `${totals[t]!.delivered} of ${expected} events delivered to ${t}`).join(', ')}; held back by ${JSON.stringify(stats?.heldBackBy ?? heldBy)} ` +
            '(a long-open transaction anywhere on the server, e.g. a benchmark, holds every relay back)',
        );
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  } finally {
    relay.off('held-back', onHeldBack);
  }
}
