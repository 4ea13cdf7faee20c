import type { ClaimedRow } from './types.ts';

/** How many jobs behind each head of an ordering key a claim may take (see Chains). */
export const FOLLOWERS_PER_HEAD = 8;

/** What a claim's rows split into. */
export interface ClaimSplit {
  /** Jobs that may start now: heads of keys and jobs without a key. */
  run: ClaimedRow[];
  /** Followers whose head is not among the rows (not expected): to hand back at once. */
  orphans: ClaimedRow[];
}

/**
 * The followers a worker claimed behind the heads of ordering keys: the next
 * jobs of each key, leased to this worker but still blocked. A follower may
 * start only once the job before it was completed and that completion
 * committed, so a key's handlers still run one at a time in enqueue order,
 * across a crash too. If the job before it ends any other way (failed,
 * snoozed, lease lost), the followers behind it are handed back, and the key
 * moves on through the database as for any other job.
 *
 * @example
 * const { run } = chains.split(claimedRows); // followers stay here
 * // later, when job `id` was completed:
 * const next = chains.next(id);              // the follower that may start now, if any
 */
export class Chains {
  /** By the id of the job each chain waits for: the rest of the chain, in key order. */
  private readonly waiting = new Map<string, ClaimedRow[]>();
  private count = 0;

  /** Followers held, all chains together. */
  get size(): number {
    return this.count;
  }

  /** Keeps a claim's followers behind their heads; returns the jobs that may start now. */
  split(rows: readonly ClaimedRow[]): ClaimSplit {
    if (!rows.some((r) => r.blocked)) return { run: [...rows], orphans: [] };
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
      const head = heads.get(key);
      if (head === undefined) {
        orphans.push(...list);
        continue;
      }
      list.sort(bySeq);
      this.waiting.set(head.id, list);
      this.count += list.length;
    }
    return { run, orphans };
  }

  /** Job `id` was completed: the follower that may start now, if any (the rest of its chain waits for that one). */
  next(id: string): ClaimedRow | undefined {
    const list = this.waiting.get(id);
    if (list === undefined) return undefined;
    this.waiting.delete(id);
    const first = list.shift()!;
    this.count -= 1;
    if (list.length > 0) this.waiting.set(first.id, list);
    return first;
  }

  /** Job `id` ended otherwise: removes and returns the followers behind it, to hand back. */
  drop(id: string): ClaimedRow[] {
    const list = this.waiting.get(id);
    if (list === undefined) return [];
    this.waiting.delete(id);
    this.count -= list.length;
    return list;
  }

  /** Every follower held (a copy). */
  toArray(): ClaimedRow[] {
    return [...this.waiting.values()].flat();
  }

  /** Removes and returns every follower. */
  takeAll(): ClaimedRow[] {
    const all = this.toArray();
    this.waiting.clear();
    this.count = 0;
    return all;
  }

  /**
   * Followers whose lease was lost are dropped, and so is the rest of their
   * chains (they must not run before a lost one): returns the lost ones and
   * the rest, to hand back.
   */
  removeLost(lostIds: ReadonlySet<string>): { lost: ClaimedRow[]; rest: ClaimedRow[] } {
    const lost: ClaimedRow[] = [];
    const rest: ClaimedRow[] = [];
    if (lostIds.size === 0) return { lost, rest };
    for (const [id, list] of this.waiting) {
      const at = list.findIndex((r) => lostIds.has(r.id));
      if (at < 0) continue;
      for (const row of list.splice(at)) (lostIds.has(row.id) ? lost : rest).push(row);
      if (list.length === 0) this.waiting.delete(id);
    }
    this.count -= lost.length + rest.length;
    return { lost, rest };
  }
}

function chainKey(row: ClaimedRow): string {
  return `${row.queue}\u0000${row.ordering_key ?? ''}`;
}

function bySeq(a: ClaimedRow, b: ClaimedRow): number {
  const x = BigInt(a.ordering_seq ?? '0');
  const y = BigInt(b.ordering_seq ?? '0');
  return x < y ? -1 : x > y ? 1 : 0;
}
