/**
 * What the shared broker adapter suite (test/brokers.test.ts) needs from each
 * broker: a fresh destination with a relay target and a consumer source on it,
 * a raw publisher (for messages mailroom did not write), the group's unacked
 * count, and a broker restart. One implementation per broker in this folder.
 */
import type { ConsumerSource } from '../../../src/brokers/source.ts';
import type { RelayTarget } from '../../../src/relay/target.ts';

/** A JSON-serialisable description of a pair, so a child process can rebuild its source. */
export type PairDescription = Record<string, string | number | boolean | null>;

export interface RawPublisher {
  /** Publishes one message with the broker's plain client (no mailroom), waiting for its confirm. */
  publish(body: string | Buffer, options?: { messageId?: string; headers?: Record<string, string> }): Promise<void>;
  close(): Promise<void>;
}

export interface BrokerPair {
  /** A relay target publishing to the destination. */
  target(): RelayTarget;
  /** A new consumer source on the destination (one per consumer; all for the same group share its messages). */
  source(options?: { prefetch?: number }): ConsumerSource;
  /** A plain publisher to the same destination. */
  raw(): Promise<RawPublisher>;
  /** Messages delivered to the destination that the group has not acknowledged (call with no source running). */
  pending(): Promise<number>;
  /** Restarts the broker this pair lives on and resolves once it accepts connections again. Only for pairs made with `restartable: true`. */
  restart(): Promise<void>;
  /** Rebuilds the source in another process: `fixture.sourceFrom(pair.describe())`. */
  describe(): PairDescription;
  /** Deletes the destination and stops a private server, if any. */
  cleanup(): Promise<void>;
}

export interface BrokerFixture {
  readonly kind: 'rabbitmq' | 'nats' | 'redis';
  /** The broker's URL from the environment (RABBITMQ_URL, NATS_URL, REDIS_URL), or null: the suite is then skipped (CI always sets it). */
  readonly url: string | null;
  /**
   * A fresh destination named after `unique` (lower-case letters, digits, `-`).
   * `restartable: true` puts it on a broker the pair may restart: a private
   * server with persistence on a free port for NATS and Redis, a private node
   * (stop_app/start_app) for RabbitMQ. The shared servers are never restarted.
   */
  pair(unique: string, options?: { restartable?: boolean }): Promise<BrokerPair>;
  /** The source of a described pair (in a child process). */
  sourceFrom(description: PairDescription, options?: { prefetch?: number }): ConsumerSource;
}
