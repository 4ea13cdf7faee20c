import type { ClaimedRow } from './types.ts';

/** How many jobs behind each head (or chain tail) of an ordering key a claim may take (see Chains). */
export const FOLLOWERS_PER_HEAD = 8;

/** A chain with this many followers left (or fewer) asks the next claim for more behind its tail. */
export const EXTEND_AT = 3;

/** What a claim's rows split into. */
export interface ClaimSplit {
  /** Jobs that may start now: heads of keys and jobs without a key. */
  run: ClaimedRow[];
  /** Followers with no chain to join (the chain ended meanwhile): to hand back at once. */
  orphans: ClaimedRow[];
}

/** The tail of a chain that may take more followers: its id and claim token. */
export interface ChainAnchor {
  id: string;
  claim: number;
}

/** What a claim may take besides heads: followers per head or anchor, the anchors, and how many in all. */
export interface FollowerClaim {
  perHead: number;
  anchors: readonly ChainAnchor[];
  room: number;
}

interface Chain {
  key: string;
  /** The claim the first follower waits for (a head, or a follower that started): see claimOf. */
  waitingOn: string;
  /** Followers not started yet, in key order. */
  list: ClaimedRow[];
  /** No more followers are asked for behind this chain (a claim brought none, or one was lost). */
  closed: boolean;
}

/**
 * The followers a worker claimed behind the heads of ordering keys: the next
 * jobs of each key, leased to this worker but still blocked. A follower may
 * start only once the job before it was completed and that completion
 * committed, so a key's handlers still run one at a time in enqueue order,
 * across a crash too. If the job before it ends any other way (failed,
 * snoozed, lease lost), the followers behind it are handed back, and the key
 * moves on through the database as for any other job. A chain running low
 * asks the next claim for more followers behind its last one (`anchors`).
 *
 * @example
 * const { run } = chains.split(claimedRows); // followers stay here
 * // later, when the job of claimed row `done` was completed:
 * const next = chains.next(done);            // the follower that may start now, if any
 */
export class Chains {
  private readonly byWaitingOn = new Map<string, Chain>();
  private readonly byKey = new Map<string, Chain>();
  private count = 0;
  /** The chains whose tails the claim in flight was asked to extend. */
  private asked: Chain[] = [];

  /** Followers held, all chains together. */
  get size(): number {
    return this.count;
  }

  /** True while a chain is held, even one whose last follower already started. */
  get active(): boolean {
    return this.byKey.size > 0;
  }

  /**
   * The tails of the chains running low, for the next claim to take more
   * followers behind (each is an unstarted follower, so no completion of it
   * can be in flight). Remembers them until the claim's rows are `split`.
   */
  anchors(): ChainAnchor[] {
    this.asked = [];
    for (const chain of this.byKey.values()) {
      if (chain.closed || chain.list.length === 0 || chain.list.length > EXTEND_AT) continue;
      this.asked.push(chain);
    }
    return this.asked.map((c) => {
      const tail = c.list[c.list.length - 1]!;
      return { id: tail.id, claim: tail.claim_count };
    });
  }

  /** Keeps a claim's followers behind their heads or chains; returns the jobs that may start now. */
  split(rows: readonly ClaimedRow[]): ClaimSplit {
    const asked = this.asked;
    this.asked = [];
    if (!rows.some((r) => r.blocked)) {
      for (const chain of asked) chain.closed = true;
      return { run: [...rows], orphans: [] };
    }
    const run: ClaimedRow[] = [];
    const heads = new Map<string, ClaimedRow>();
    const followers = new Map<string, ClaimedRow[]>();
    for (const row of rows) {
      if (row.blocked && row.ordering_key !== null) {
        const key = chainKey(row);
        const list = followers.get(key);
        if (list) list.push(row);
        else followers.set(key, [row]);
      } else {
        run.push(row);
        if (row.ordering_key !== null) heads.set(chainKey(row), row);
      }
    }
    const orphans: ClaimedRow[] = [];
    for (const [key, list] of followers) {
      list.sort(bySeq);
      const head = heads.get(key);
      const chain = this.byKey.get(key);
      if (head !== undefined) {
        // A chain of this key still here ended in the database already (its last job's completion
        // committed and let the key go; this worker has not seen the reply yet): the head starts anew.
        const fresh: Chain = { key, waitingOn: claimOf(head), list, closed: false };
        this.byKey.set(key, fresh);
        this.byWaitingOn.set(fresh.waitingOn, fresh);
      } else if (chain !== undefined && !chain.closed) {
        chain.list.push(...list); // behind the tail it was asked to extend
      } else {
        orphans.push(...list);
        continue;
      }
      this.count += list.length;
    }
    for (const chain of asked) if (!followers.has(chain.key)) chain.closed = true;
    return { run, orphans };
  }

  /**
   * The job of this claim was completed: the follower that may start now, if
   * any, and how many are left behind it. The chain then waits for that one.
   */
  next(done: ClaimedRow): { row: ClaimedRow; left: number } | undefined {
    const id = claimOf(done);
    const chain = this.byWaitingOn.get(id);
    if (chain === undefined) return undefined;
    this.byWaitingOn.delete(id);
    const row = chain.list.shift();
    if (row === undefined) {
      if (this.byKey.get(chain.key) === chain) this.byKey.delete(chain.key); // ran out: the key goes back to the database
      return undefined;
    }
    this.count -= 1;
    chain.waitingOn = claimOf(row);
    this.byWaitingOn.set(chain.waitingOn, chain);
    return { row, left: chain.list.length };
  }

  /** The job of this claim ended otherwise: ends its chain and returns the followers behind it, to hand back. */
  drop(ended: ClaimedRow): ClaimedRow[] {
    const id = claimOf(ended);
    const chain = this.byWaitingOn.get(id);
    if (chain === undefined) return [];
    this.byWaitingOn.delete(id);
    if (this.byKey.get(chain.key) === chain) this.byKey.delete(chain.key);
    chain.closed = true;
    this.count -= chain.list.length;
    return chain.list.splice(0);
  }

  /** Every follower held (a copy). */
  toArray(): ClaimedRow[] {
    const all: ClaimedRow[] = [];
    for (const chain of this.byKey.values()) all.push(...chain.list);
    return all;
  }

  /** Removes and returns every follower, ending every chain. */
  takeAll(): ClaimedRow[] {
    const all = this.toArray();
    for (const chain of this.byKey.values()) chain.closed = true;
    this.byKey.clear();
    this.byWaitingOn.clear();
    this.count = 0;
    return all;
  }

  /**
   * Followers whose lease was lost are dropped, and so is the rest of their
   * chains (they must not run before a lost one); such a chain takes no more
   * followers. Returns the lost ones and the rest, to hand back.
   */
  removeLost(lostIds: ReadonlySet<string>): { lost: ClaimedRow[]; rest: ClaimedRow[] } {
    const lost: ClaimedRow[] = [];
    const rest: ClaimedRow[] = [];
    if (lostIds.size === 0) return { lost, rest };
    for (const chain of this.byKey.values()) {
      const at = chain.list.findIndex((r) => lostIds.has(r.id));
      if (at < 0) continue;
      chain.closed = true;
      for (const row of chain.list.splice(at)) (lostIds.has(row.id) ? lost : rest).push(row);
    }
    this.count -= lost.length + rest.length;
    return { lost, rest };
  }
}

/**
 * A claim of a job, as a key: a job claimed again (after a rescue) is another claim.
 *
 * @example
 * claimOf({ id: '0190…', claim_count: 2 }) // '0190…/2'
 */
export function claimOf(row: { id: string; claim_count: number }): string {
  return `${row.id}/${row.claim_count}`;
}

function chainKey(row: ClaimedRow): string {
  return `${row.queue}\u0000${row.ordering_key ?? ''}`;
}

function bySeq(a: ClaimedRow, b: ClaimedRow): number {
  const x = BigInt(a.ordering_seq ?? '0');
  const y = BigInt(b.ordering_seq ?? '0');
  return x < y ? -1 : x > y ? 1 : 0;
}
