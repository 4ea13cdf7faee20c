/** What a relay emits, and what its `flush()` returns (src/relay/relay.ts). */
import type { SafetyWarning } from '../brokers/safety.ts';
import type { HeldBackBy } from './held-back.ts';
import type { ParkedEvent } from './parking.ts';

/** Events a relay emits. */
export interface RelayEvents {
  /** A batch was delivered to a target and its cursor advanced. */
  delivered: [info: { target: string; count: number; cursor: { xid: string; position: string } }];
  /** Committed events wait behind an open transaction (emitted when it starts, then every 10 s while it lasts). */
  'held-back': [info: { target: string; waiting: number; heldBackBy: HeldBackBy }];
  'lease-acquired': [info: { target: string; token: string }];
  /** Another relay took the target over (this one had stopped renewing in time). */
  'lease-lost': [info: { target: string }];
  pruned: [info: { events: number; parked: number }];
  /** A target refused an event for good and it was parked (`onRefused: 'park'`): the events after it go on. */
  parked: [info: ParkedEvent];
  /** A target's broker setting breaks a guarantee (found at start; printed with console.warn when nobody listens). */
  warning: [warning: SafetyWarning];
  /** Infrastructure trouble (database unreachable, a target failing). The relay keeps going. */
  error: [error: unknown];
}

/** What one `flush()` did per target. */
export interface RelayFlushResult {
  /** Events delivered. */
  delivered: number;
  /** True when committed events still wait behind an open transaction. */
  heldBack: boolean;
  /** False when another relay holds the target's lease (nothing was done). */
  leased: boolean;
}
