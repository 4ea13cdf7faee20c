/**
 * A consumer source the test drives by hand: `push` delivers a message and
 * resolves with what mailroom did with it (acked, or given back). For tests
 * of mailroom's own side of a source (store, then ack; dead letters; retries
 * while the database refuses) — the broker adapters have their own suite
 * against the real brokers (test/brokers.test.ts).
 */
import type { ConsumerSource, SourceContext, SourceMessage } from '../../src/index.ts';

export interface ScriptedSource extends ConsumerSource {
  /** Delivers one message; resolves 'ack' or 'nack' when mailroom settles it. */
  push(body: string | Uint8Array, options?: { messageId?: string; headers?: Record<string, string>; onAck?: () => Promise<void> }): Promise<'ack' | 'nack'>;
  readonly context: SourceContext | null;
  readonly stopped: boolean;
}

/** `stopHangs`: its stop() never resolves (a broker that never answers a close). */
export function scriptedSource(name = 'scripted', options: { stopHangs?: boolean } = {}): ScriptedSource {
  let deliver: ((m: SourceMessage) => void) | null = null;
  let context: SourceContext | null = null;
  let stopped = false;
  let n = 0;
  return {
    kind: 'scripted',
    name,
    get context() {
      return context;
    },
    get stopped() {
      return stopped;
    },
    async start(d, c) {
      deliver = d;
      context = c;
    },
    async stop() {
      stopped = true;
      deliver = null;
      if (options.stopHangs) await new Promise<never>(() => {});
    },
    push(body, options = {}) {
      if (deliver === null) throw new Error('the scripted source is not started');
      const d = deliver;
      return new Promise((resolve) => {
        let settled = false;
        const message: SourceMessage = {
          body,
          messageId: options.messageId ?? null,
          headers: options.headers ?? {},
          origin: `${name} message ${++n}`,
          async ack() {
            if (settled) throw new Error('settled twice');
            settled = true;
            await options.onAck?.();
            resolve('ack');
          },
          nack() {
            if (settled) throw new Error('settled twice');
            settled = true;
            resolve('nack');
          },
        };
        d(message);
      });
    },
  };
}
