/**
 * The idempotency store: runs a request's handler once per (scope, key), in
 * a transaction that also records its response, and answers repeats from the
 * record. Framework-neutral; `middleware.ts` fits it to Node's http.
 */
import type { Mailroom, MailroomTransaction } from '../mailroom.ts';
import { quoteSchema } from '../identifiers.ts';
import { idempotencyQueries, type IdempotencyQueries } from './queries.ts';

/** A response as recorded and replayed. */
export interface RecordedResponse {
  status: number;
  /** Lower-case names; a value is a string or, for a repeated header, a list. */
  headers: Record<string, string | string[]>;
  body: Buffer;
}

/** What became of one request with a key. */
export type IdempotentOutcome =
  /** The handler ran and its response was recorded with its work (status below 500). */
  | { kind: 'recorded'; response: RecordedResponse }
  /** The handler ran and answered 500 or more: its work was rolled back and nothing recorded, so a retry runs it again. */
  | { kind: 'rolled-back'; response: RecordedResponse }
  /** An earlier request with the key had this response; the handler did not run. */
  | { kind: 'replayed'; response: RecordedResponse }
  /** A request with the key is running now. */
  | { kind: 'in-progress' }
  /** The key was used for a different request (its fingerprint differs). */
  | { kind: 'mismatch' };

/** Thrown inside the transaction to roll back a 5xx response's work. */
class RollBack extends Error {
  constructor(readonly response: RecordedResponse) {
    super('rolled back: the handler answered with a server error');
  }
}

interface RecordedRow {
  fingerprint: string;
  status: number;
  headers: Record<string, string | string[]> | string;
  body: Uint8Array;
}

export class IdempotencyStore {
  readonly #queries: IdempotencyQueries;

  constructor(
    private readonly mailroom: Mailroom,
    private readonly retentionMs: number,
  ) {
    this.#queries = idempotencyQueries(quoteSchema(mailroom.schema));
  }

  /**
   * Runs `handler` for the request unless one with the same scope and key
   * ran already (its response is replayed) or runs now. The handler gets
   * the transaction that records its response: work done through it
   * commits only with that record.
   */
  async run(scope: string, key: string, fingerprint: string, handler: (tx: MailroomTransaction) => Promise<RecordedResponse>): Promise<IdempotentOutcome> {
    const q = this.#queries;
    try {
      return await this.mailroom.transaction(async (tx): Promise<IdempotentOutcome> => {
        const { rows: lock } = await tx.query<{ locked: boolean }>(q.tryLock, [scope, key]);
        if (!lock[0]?.locked) return { kind: 'in-progress' };
        const { rows } = await tx.query<RecordedRow>(q.recorded, [scope, key, this.retentionMs]);
        const earlier = rows[0];
        if (earlier) {
          if (earlier.fingerprint !== fingerprint) return { kind: 'mismatch' };
          const headers = typeof earlier.headers === 'string' ? (JSON.parse(earlier.headers) as RecordedResponse['headers']) : earlier.headers;
          return { kind: 'replayed', response: { status: earlier.status, headers, body: Buffer.from(earlier.body) } };
        }
        const response = await handler(tx);
        if (response.status >= 500) throw new RollBack(response);
        await tx.query(q.record, [scope, key, fingerprint, response.status, JSON.stringify(response.headers), response.body]);
        return { kind: 'recorded', response };
      });
    } catch (error) {
      if (error instanceof RollBack) return { kind: 'rolled-back', response: error.response };
      throw error;
    }
  }

  /** Deletes keys older than the retention, in batches; how many. */
  async prune(batchSize = 1000): Promise<number> {
    let deleted = 0;
    for (;;) {
      const { rowCount } = await this.mailroom.transaction((tx) => tx.query(this.#queries.prune, [this.retentionMs, batchSize]));
      deleted += rowCount;
      if (rowCount < batchSize) return deleted;
    }
  }
}
