/**
 * A simple in-memory model of the job state machine (docs/JOBS.md, docs/ORDERING.md,
 * docs/DEAD-LETTERS.md) for the model-based tests in test/model.test.ts. It knows
 * nothing of SQL: each method says what one operation must do to the jobs.
 */

export type ModelState = 'scheduled' | 'available' | 'active' | 'retrying' | 'completed' | 'dead' | 'cancelled';
export type ModelType = 'plain' | 'hold';
export type FailureKind = 'transient' | 'later' | 'permanent';

/** Attempts per type; `hold` keeps its ordering key when dead (ordering.onDead: 'hold'). */
export const MAX_ATTEMPTS: Record<ModelType, number> = { plain: 3, hold: 2 };

const WAITING: readonly ModelState[] = ['scheduled', 'available', 'retrying'];
const UNFINISHED: readonly ModelState[] = [...WAITING, 'active'];

export interface ModelJob {
  id: string;
  type: ModelType;
  key: string | null;
  orderingKey: string | null;
  state: ModelState;
  attempt: number;
  maxAttempts: number;
  /** The fencing token: claims so far. */
  claim: number;
  /** run_at has passed (waiting states). */
  due: boolean;
  blocked: boolean;
  /** Position behind its ordering key (when it last took the key up). */
  orderSeq: number;
  /** The lease ran out (active only). */
  expired: boolean;
  deadReason: string | null;
  lastCategory: string | null;
  /** Rows in its error history (one per failed or rescued attempt). */
  errors: number;
  /** When it last finished (completed, dead, cancelled), in model steps. */
  finishedSeq: number;
}

/** One claim handed out: the job and the claim token it was claimed with (it may be stale by now). */
export interface ModelToken {
  id: string;
  claim: number;
}

export function isWaiting(state: ModelState): boolean {
  return WAITING.includes(state);
}

export function isUnfinished(state: ModelState): boolean {
  return UNFINISHED.includes(state);
}

export class JobModel {
  /** Jobs that exist (not pruned), in enqueue order. */
  readonly jobs: ModelJob[] = [];
  /** Ids of jobs that retention deleted. */
  readonly pruned: string[] = [];
  readonly tokens: ModelToken[] = [];
  /** `id:claim` of each completion made through ctx.tx that committed: its write must exist, no other. */
  readonly effects: string[] = [];
  private seq = 0;

  /** `dedupWindow`: retention.dedupKeys is set, so a completed job's key still deduplicates. */
  constructor(readonly dedupWindow: boolean) {}

  job(id: string): ModelJob | undefined {
    return this.jobs.find((j) => j.id === id);
  }

  /** Every id the test has seen, pruned ones included (operations on them must be harmless). */
  allIds(): string[] {
    return [...this.jobs.map((j) => j.id), ...this.pruned];
  }

  holdsKey(j: ModelJob): boolean {
    return isUnfinished(j.state) || (j.state === 'dead' && j.type === 'hold');
  }

  claimable(): ModelJob[] {
    return this.jobs.filter((j) => isWaiting(j.state) && !j.blocked && j.due);
  }

  /** The unfinished job of this type holding the dedup key, other than `except`. */
  keyHolder(type: ModelType, key: string | null, except?: ModelJob): ModelJob | undefined {
    if (key === null) return undefined;
    return this.jobs.find((j) => j !== except && j.type === type && j.key === key && isUnfinished(j.state));
  }

  /**
   * What enqueue must answer: `{ existing }` ids any of which may be returned (the job that
   * holds the key, or with a key window the completed jobs that carry it), or `null`: a new job.
   */
  dedupOf(type: ModelType, key: string | null): string[] | null {
    if (key === null) return null;
    if (this.dedupWindow) {
      const completed = this.jobs.filter((j) => j.type === type && j.key === key && j.state === 'completed');
      if (completed.length > 0) return completed.map((j) => j.id);
    }
    const holder = this.keyHolder(type, key);
    return holder ? [holder.id] : null;
  }

  enqueued(id: string, type: ModelType, key: string | null, orderingKey: string | null, delayed: boolean): ModelJob {
    const job: ModelJob = {
      id,
      type,
      key,
      orderingKey,
      state: delayed ? 'scheduled' : 'available',
      attempt: 0,
      maxAttempts: MAX_ATTEMPTS[type],
      claim: 0,
      due: !delayed,
      blocked: false,
      orderSeq: 0,
      expired: false,
      deadReason: null,
      lastCategory: null,
      errors: 0,
      finishedSeq: 0,
    };
    this.jobs.push(job);
    if (orderingKey !== null) this.takeKey(job);
    return job;
  }

  claimed(job: ModelJob): ModelToken {
    this.moveTo(job, 'active');
    job.attempt++;
    job.claim++;
    job.expired = false;
    const token = { id: job.id, claim: job.claim };
    this.tokens.push(token);
    return token;
  }

  /** The job a token still owns (active, same claim), if any: only that job a fenced write may change. */
  owner(token: ModelToken): ModelJob | undefined {
    const job = this.job(token.id);
    return job && job.state === 'active' && job.claim === token.claim ? job : undefined;
  }

  completed(job: ModelJob): void {
    this.moveTo(job, 'completed');
    job.finishedSeq = ++this.seq;
  }

  /** A failed attempt as the worker records it: retried while attempts remain, else dead. */
  failed(job: ModelJob, kind: FailureKind): void {
    job.errors++;
    job.lastCategory = kind === 'permanent' ? 'permanent' : 'transient';
    if (kind !== 'permanent' && job.attempt < job.maxAttempts) {
      this.moveTo(job, 'retrying');
      job.due = kind === 'transient';
    } else {
      this.died(job, kind === 'permanent' ? 'permanent' : 'max-attempts');
    }
  }

  /** Snooze or hand back: waiting again, the attempt not spent. */
  rescheduled(job: ModelJob, later: boolean): void {
    this.moveTo(job, later ? 'scheduled' : 'available');
    job.attempt--;
    job.due = !later;
  }

  /** maintain(): every active job whose lease ran out goes to retrying (due now) or dead. */
  rescue(): ModelJob[] {
    const expired = this.jobs.filter((j) => j.state === 'active' && j.expired);
    for (const job of expired) {
      job.errors++;
      job.lastCategory = 'lease-expired';
      if (job.attempt >= job.maxAttempts) this.died(job, 'max-attempts');
      else {
        this.moveTo(job, 'retrying');
        job.due = true;
      }
    }
    return expired;
  }

  /**
   * Retention past the age of the jobs `old` selects: deletes those completed, cancelled or dead. A
   * deleted job that held its key (dead, with onDead 'hold') hands it on (migration 14).
   */
  prune(old: (job: ModelJob) => boolean): number {
    const gone = this.jobs.filter((j) => old(j) && (j.state === 'completed' || j.state === 'cancelled' || j.state === 'dead'));
    const heldKeys = new Set(gone.filter((j) => j.orderingKey !== null && this.holdsKey(j)).map((j) => j.orderingKey!));
    for (const job of gone) {
      this.jobs.splice(this.jobs.indexOf(job), 1);
      this.pruned.push(job.id);
    }
    for (const key of heldKeys) this.handOn(key);
    return gone.length;
  }

  cancel(job: ModelJob): boolean {
    if (!isWaiting(job.state) && job.state !== 'dead') return false;
    this.moveTo(job, 'cancelled');
    job.finishedSeq = ++this.seq;
    return true;
  }

  /** jobs.retry and a replay: a waiting job runs now; a dead or cancelled one gets a fresh budget. */
  retried(job: ModelJob): void {
    if (job.state === 'dead' || job.state === 'cancelled') {
      job.maxAttempts = job.attempt + MAX_ATTEMPTS[job.type];
      job.deadReason = null;
    }
    this.moveTo(job, 'available');
    job.due = true;
  }

  madeDue(job: ModelJob): void {
    job.due = true;
    this.touchedWhileBlocked(job);
  }

  private died(job: ModelJob, reason: string): void {
    this.moveTo(job, 'dead');
    job.deadReason = reason;
    job.finishedSeq = ++this.seq;
  }

  /** A state change, with what it does to the job's ordering key (take it up again, or hand it on). */
  private moveTo(job: ModelJob, state: ModelState): void {
    const held = this.holdsKey(job);
    job.state = state;
    if (job.orderingKey === null) return;
    const holds = this.holdsKey(job);
    if (!held && holds) this.takeKey(job);
    if (held && !holds) this.handOn(job.orderingKey);
    this.touchedWhileBlocked(job);
  }

  /**
   * Any write to a job that waits blocked behind its key counts as letting the key go (migration 13:
   * that is how a follower handed back gives the key on): if no job holds the key any more (its
   * holder was pruned as a dead letter), the first job waiting behind it is unblocked.
   */
  private touchedWhileBlocked(job: ModelJob): void {
    if (job.orderingKey !== null && job.blocked && isWaiting(job.state)) this.handOn(job.orderingKey);
  }

  /** The job queues behind every other job holding its key. */
  private takeKey(job: ModelJob): void {
    job.orderSeq = ++this.seq;
    job.blocked = this.jobs.some((o) => o !== job && o.orderingKey === job.orderingKey && this.holdsKey(o));
  }

  /** When no unblocked job holds the key any more, the first one waiting behind it is unblocked. */
  private handOn(key: string): void {
    if (this.jobs.some((h) => h.orderingKey === key && !h.blocked && this.holdsKey(h))) return;
    const next = this.jobs
      .filter((j) => j.orderingKey === key && j.blocked && isWaiting(j.state))
      .sort((a, b) => a.orderSeq - b.orderSeq)[0];
    if (next) next.blocked = false;
  }
}
