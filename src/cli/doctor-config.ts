/**
 * What `mailroom doctor` checks in a config file: each broker target of its
 * relay, told the republish horizon of that relay's lease, and each consumer
 * group's broker source, told the group and its handler timeout. These are the
 * checks the relay and the consumers run when `mailroom start` starts them.
 */
import type { SafetyWarning } from '../brokers/safety.ts';
import { DEFAULT_MAX_PAYLOAD_BYTES } from '../payload.ts';
import type { MailroomConfig } from '../config/define-config.ts';
import { resolveConsumerOptions } from '../consumers/options.ts';
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import { resolveRelayOptions } from '../relay/options.ts';
import { republishHorizonMs } from '../relay/relay.ts';
import type { RelayTarget } from '../relay/target.ts';

/** One thing doctor checks, and how to close what it opened. */
export interface Check {
  /** What is checked: `rabbitmq exchange shop` (a flag), or a config entry: `relay target rabbitmq:shop`. */
  subject: string;
  /** Whether it is a config entry (its warnings then name it). */
  fromConfig: boolean;
  /** Null for a target or source without a `check()` (nothing to ask its broker). */
  run: (() => Promise<SafetyWarning[]>) | null;
  close(): Promise<void>;
}

/** Stands for the internal fan-out, which has nothing to check, while the relay's options are resolved. */
const INTERNAL: RelayTarget = { name: INTERNAL_TARGET, publish: async () => {} };

/**
 * The config's relay targets, then its consumers' sources, as checks.
 * Consumers without a source read the outbox and have no broker.
 */
export function configChecks(config: MailroomConfig): Check[] {
  const checks: Check[] = [];
  if (config.relay !== undefined && config.relay !== false) {
    const relay = resolveRelayOptions(config.relay, INTERNAL);
    const context = { republishHorizonMs: republishHorizonMs(relay.leaseMs), maxPayloadBytes: config.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES };
    for (const target of relay.targets) {
      if (target === INTERNAL) continue;
      const check = target.check?.bind(target);
      checks.push({ subject: `relay target ${target.name}`, fromConfig: true, run: check ? () => check(context) : null, close: async () => target.close?.() });
    }
  }
  for (const options of config.consumers ?? []) {
    const source = options.source;
    if (source === undefined) continue;
    const { group, timeoutMs } = resolveConsumerOptions(options);
    const check = source.check?.bind(source);
    checks.push({
      subject: `consumer ${group} source ${source.kind} ${source.name}`,
      fromConfig: true,
      run: check ? () => check({ group, handlerTimeoutMs: timeoutMs }) : null,
      close: () => source.stop(),
    });
  }
  return checks;
}
