/**
 * What a relay keeps per target between rounds, what a round returns, and
 * what the rounds need from the relay that runs them (src/relay/relay.ts).
 */
import type { Driver } from '../storage/driver.ts';
import type { Waker } from '../worker/waker.ts';
import type { KnownCursor } from './known-cursor.ts';
import type { ResolvedRelayOptions } from './options.ts';
import type { OutboxPoint } from './read-batch.ts';
import type { ReadBatch } from './read-ahead.ts';
import type { ReadSize } from './read-size.ts';
import type { RelayQueries } from './relay-queries.ts';
import type { RelayEvents } from './relay-events.ts';
import type { ParkedEvents } from './parking.ts';
import type { RelayTarget } from './target.ts';

export interface TargetState {
  target: RelayTarget;
  token: string | null;
  /** Rounds of one target never overlap within a process. */
  busy: Promise<unknown>;
  /** Cuts this target's sleep short (NOTIFY, stop). */
  waker: Waker;
  heldBackSince: number | null;
  lastHeldBackReport: number;
  /** A read-ahead target's next batch, read (and for a pipelined target sent) while the last one was being confirmed. */
  ahead: Promise<Ahead | null> | null;
  /** Rounds in a row that found events deliverable and delivered none (see after-round.ts). */
  emptyAgain: number;
  /** The target's parked events its cursor has not passed: left out of its batches. */
  parked: ParkedEvents;
  /** How many rows the next read asks for. */
  readSize: ReadSize;
  /** A read-ahead target's cursor as this relay last read or advanced it (see known-cursor.ts); taken by each round. */
  known: KnownCursor | null;
}

/** A batch read ahead; `sent` settles with true when a pipelined target's conditional send of it was confirmed. */
export interface Ahead {
  batch: ReadBatch;
  sent: Promise<boolean> | null;
}

export type Round =
  | { kind: 'lost' }
  | { kind: 'done'; delivered: number; exhausted: boolean; blockedBy: bigint | null; fence: bigint; cursor: OutboxPoint };

/** A round that kept the lease. */
export type DoneRound = Extract<Round, { kind: 'done' }>;

/** What the rounds of a target need from the relay that runs them. */
export interface RoundHost {
  /** The relay's id (the lease holder). */
  readonly id: string;
  /** The relay's driver: a stop that cuts rounds short cancels what it runs. */
  readonly db: Driver;
  readonly queries: RelayQueries;
  readonly options: ResolvedRelayOptions;
  /** Aborted when a stop's timeout is spent with rounds still in flight. */
  readonly halt: AbortSignal;
  /** Which outbox this is (`RelayContext.origin`); undefined when the database does not say. */
  origin(): Promise<string | undefined>;
  /** Emits one of the relay's events; false when nobody listens. */
  tell<K extends keyof RelayEvents>(event: K, ...info: RelayEvents[K]): boolean;
  /** Reports trouble (the relay's `error` event, or the console). */
  report(error: unknown): void;
}
