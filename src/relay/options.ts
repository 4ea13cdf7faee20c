import { hostname } from 'node:os';
import { checkOptionNames, type OptionNames } from '../option-names.ts';
import { toMilliseconds, type Duration } from '../duration.ts';
import { ValidationError } from '../errors.ts';
import { assertName } from '../identifiers.ts';
import { newId } from '../ids.ts';
import { INTERNAL_TARGET } from './internal-target.ts';
import type { RelayTarget } from './target.ts';

/** Options of `mailroom.relay()`. */
export interface RelayOptions {
  /** More targets (broker adapters, your own). The internal fan-out to consumer groups is always included unless `internal: false`. */
  to?: RelayTarget[];
  /** Fan events out to the consumer groups of this database. Default true. */
  internal?: boolean;
  /**
   * Events per batch (one round: one transaction, or one broker confirm). Left out: 100, doubling
   * after each full batch while a backlog lasts, up to 1,000 (while a batch's envelopes stay within
   * 4 Mi characters), and back to 100 once the backlog is gone. Given: always this many. A batch
   * grows past it only to keep a key's events together.
   */
  batchSize?: number;
  /** How often to look for events when no NOTIFY arrives. Default `'1s'`. */
  pollInterval?: Duration;
  /** How long a target stays owned by this relay without a renewal; another relay takes over after it. Default `'30s'`. */
  lease?: Duration;
  /** How long delivered events stay in the outbox (for new groups with `from: 'earliest'` and for replays). Default `'7d'`. */
  retention?: Duration;
  /**
   * How long an event parked in `relay_parked` (refused for good by a target) is kept for an operator to
   * republish or discard, before it is deleted with its envelope (personal data must not stay forever). Default `'30d'`.
   */
  parkedRetention?: Duration;
  /** Identifies this relay as the holder of a lease. Default host:pid:random. */
  id?: string;
  /**
   * What to do with an event a target refuses for good (it throws
   * `RefusedEventError`: too large for the broker, say). `'park'` (default):
   * record it in `relay_parked`, move past it and deliver the events after it.
   * `'hold'`: retry it, holding every later event of that target back until
   * the cause is fixed.
   */
  onRefused?: 'park' | 'hold';
}

/** Relay options validated, with defaults filled in. */
export interface ResolvedRelayOptions {
  targets: RelayTarget[];
  /** Undefined: the default, which grows during a backlog (see `ReadSize`). */
  batchSize: number | undefined;
  pollMs: number;
  leaseMs: number;
  retentionMs: number;
  parkedRetentionMs: number;
  id: string;
  onRefused: 'park' | 'hold';
}

function invalid(path: string, message: string): ValidationError {
  return new ValidationError(message, [{ path, message }]);
}

/** Every option name of `relay()` (the config file's relay is checked against it too). */
export const RELAY_OPTION_NAMES: OptionNames<RelayOptions> = {
  to: true, internal: true, batchSize: true, pollInterval: true, lease: true, retention: true, parkedRetention: true, id: true, onRefused: true,
};

/** Validates relay options (a ValidationError naming the option) and fills in defaults. */
export function resolveRelayOptions(options: RelayOptions, internal: RelayTarget): ResolvedRelayOptions {
  checkOptionNames(options, RELAY_OPTION_NAMES, 'relay');
  if (typeof options !== 'object' || options === null) throw invalid('options', 'relay: options must be an object');
  const extra = options.to ?? [];
  if (!Array.isArray(extra)) throw invalid('to', 'relay: to must be an array of targets');
  for (const [i, t] of extra.entries()) {
    if (typeof t !== 'object' || t === null || typeof t.publish !== 'function') throw invalid(`to[${i}]`, `relay: to[${i}] is not a target ({ name, publish(events, context) })`);
    assertName(t.name, `relay target to[${i}] name`);
    if (t.name === INTERNAL_TARGET) throw invalid(`to[${i}]`, `relay: the target name '${INTERNAL_TARGET}' is reserved for the internal fan-out`);
  }
  const names = extra.map((t) => t.name);
  const dup = names.find((n, i) => names.indexOf(n) !== i);
  if (dup !== undefined) throw invalid('to', `relay: two targets are named ${JSON.stringify(dup)}; each target needs its own name (it names its cursor)`);
  const targets = options.internal === false ? [...extra] : [internal, ...extra];
  if (targets.length === 0) throw invalid('to', 'relay: no targets (internal: false and no to)');
  // null means the default, as it did when the default was filled in here (and as for the other options).
  const batchSize = options.batchSize ?? undefined;
  if (batchSize !== undefined && (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > 10_000)) {
    throw invalid('batchSize', `relay: batchSize must be an integer from 1 to 10000, got ${String(options.batchSize)}`);
  }
  const leaseMs = toMilliseconds(options.lease ?? '30s', 'relay lease');
  if (leaseMs < 100) throw invalid('lease', `relay: lease must be at least 100ms, got ${leaseMs} ms`);
  const id = options.id ?? `${hostname()}:${process.pid}:${newId().slice(-8)}`;
  if (typeof id !== 'string' || id.length === 0 || id.length > 200) throw invalid('id', 'relay: id must be a non-empty string of at most 200 characters');
  const onRefused = options.onRefused ?? 'park';
  if (onRefused !== 'park' && onRefused !== 'hold') {
    throw invalid('onRefused', `relay: onRefused must be 'park' or 'hold', got ${JSON.stringify(options.onRefused) ?? String(options.onRefused)}`);
  }
  return {
    targets,
    batchSize,
    pollMs: toMilliseconds(options.pollInterval ?? '1s', 'relay pollInterval'),
    leaseMs,
    retentionMs: toMilliseconds(options.retention ?? '7d', 'relay retention'),
    parkedRetentionMs: toMilliseconds(options.parkedRetention ?? '30d', 'relay parkedRetention'),
    id,
    onRefused,
  };
}
