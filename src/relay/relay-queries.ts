import type { NamedQuery } from '../storage/driver.ts';
import { packedEventColumns } from '../events/envelope-sql.ts';
import { namedQueries } from '../storage/named.ts';

/**
 * Statements of the relay: its fenced lease per target, the commit-safe read
 * of the outbox, and its reports. For one quoted schema; every value is a bind
 * parameter. Positions and xids travel as text (bigint, xid8).
 */
export interface RelayQueries {
  ensureCursor: NamedQuery;
  acquire: NamedQuery;
  renew: NamedQuery;
  release: NamedQuery;
  fence: NamedQuery;
  beginRound: NamedQuery;
  candidates: NamedQuery;
  predecessors: NamedQuery;
  advance: NamedQuery;
  advanceNow: NamedQuery;
  afterCursor: NamedQuery;
  pastCursor: NamedQuery;
  oldestTransaction: NamedQuery;
  cursorStats: NamedQuery;
  park: NamedQuery;
  parkedAhead: NamedQuery;
  origin: NamedQuery;
}

const MS = `* interval '1 millisecond'`;

/** Builds the relay statements for a quoted schema name. */
export function relayQueries(quotedSchema: string): RelayQueries {
  const s = quotedSchema;
  const q = namedQueries(quotedSchema);
  return {
    // $1 target. The cursor row of a target that never ran: at the start of the outbox.
    ensureCursor: q('relay_ensure_cursor', `INSERT INTO ${s}.relay_cursors (target) VALUES ($1) ON CONFLICT (target) DO NOTHING`),
    // $1 target, $2 holder, $3 lease ms. Takes a free or expired lease with a new fencing token.
    acquire: q(
      'relay_acquire',
      `INSERT INTO ${s}.relay_cursors AS c (target, holder, token, locked_until) VALUES ($1, $2, 1, now() + $3::bigint ${MS})
       ON CONFLICT (target) DO UPDATE SET holder = $2, token = c.token + 1, locked_until = now() + $3::bigint ${MS}, updated_at = now()
        WHERE c.holder IS NULL OR c.locked_until IS NULL OR c.locked_until < now()
       RETURNING token::text AS token`,
    ),
    // $1 target, $2 holder, $3 token, $4 lease ms
    renew: q(
      'relay_renew',
      `UPDATE ${s}.relay_cursors SET locked_until = now() + $4::bigint ${MS}
        WHERE target = $1 AND holder = $2 AND token = $3::bigint RETURNING token`,
    ),
    // $1 target, $2 holder, $3 token
    release: q(
      'relay_release',
      `UPDATE ${s}.relay_cursors SET holder = NULL, locked_until = NULL, updated_at = now()
        WHERE target = $1 AND holder = $2 AND token = $3::bigint`,
    ),
    // Every transaction with an xid below this one has ended: no row below it can appear later.
    // Read before the round takes any lock, so the relay's own transaction has no xid yet.
    fence: q('relay_fence', `SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS fence`),
    // $1 target, $2 holder, $3 token, $4 lease ms. The fenced start of a round: locks the cursor row
    // until the round commits (zero rows: the lease was lost) and renews the lease.
    beginRound: q(
      'relay_begin_round',
      `UPDATE ${s}.relay_cursors SET locked_until = now() + $4::bigint ${MS}
        WHERE target = $1 AND holder = $2 AND token = $3::bigint
       RETURNING cursor_xid::text AS cursor_xid, cursor_position::text AS cursor_position`,
    ),
    // $1 cursor xid, $2 cursor position, $3 fence (null: read it now, in this statement), $4 limit:
    // the next rows past the cursor whose transactions have all ended, in (xid, position) order, as
    // stored events (the envelope's text built here; a batch is what the plan keeps of them), with the
    // same key's previous row (migration 12). Every row carries the fence; with no row past the
    // cursor, one row of nulls carries it. No ORDER BY outside: the rows come in the index's order
    // from the one outer row's nested loop, and sorting them again (wide rows) took a third of the
    // statement's time; the plan checks the order and sorts only if it ever differs.
    candidates: q(
      'relay_candidates',
      `SELECT f.fence::text AS fence, c.*
         FROM (SELECT COALESCE($3::xid8, pg_snapshot_xmin(pg_current_snapshot())) AS fence) AS f
         LEFT JOIN LATERAL (
           SELECT ${packedEventColumns('o')}
             FROM ${s}.outbox AS o
            WHERE (o.xid, o.position) > ($1::xid8, $2::bigint) AND o.xid < f.fence
            ORDER BY o.xid, o.position LIMIT $4) AS c ON true`,
    ),
    // $1 keys, $2 the highest position of each key in the rows read so far, $3 cursor xid,
    // $4 cursor position. For keys whose rows do not name their previous row (written under
    // REPEATABLE READ or SERIALIZABLE, or before migration 12). Walks each key down from that
    // position, one index probe per row, and stops at the first row already delivered (at or
    // below the cursor): what a key has delivered is always a prefix of its rows in position
    // order. Returns every undelivered row of the keys below those positions, eligible (below the
    // fence) or not.
    predecessors: q(
      'relay_predecessors',
      `WITH RECURSIVE walk(subject, position, xid) AS (
         SELECT k.subject, k.top, NULL::xid8 FROM unnest($1::text[], $2::bigint[]) AS k(subject, top)
         UNION ALL
         SELECT w.subject, p.position, p.xid
           FROM walk AS w
           CROSS JOIN LATERAL (
             SELECT o.position, o.xid FROM ${s}.outbox AS o
              WHERE o.subject = w.subject AND o.position < w.position
              ORDER BY o.position DESC LIMIT 1) AS p
          WHERE (p.xid, p.position) > ($3::xid8, $4::bigint))
       SELECT subject, position::text AS position, xid::text AS xid FROM walk WHERE xid IS NOT NULL`,
    ),
    // $1 target, $2 holder, $3 token, $4 cursor xid, $5 cursor position, $6 delivered
    advance: q(
      'relay_advance',
      `UPDATE ${s}.relay_cursors
          SET cursor_xid = $4::xid8, cursor_position = $5::bigint, delivered = delivered + $6::bigint, delivered_at = now(), updated_at = now()
        WHERE target = $1 AND holder = $2 AND token = $3::bigint AND (cursor_xid, cursor_position) < ($4::xid8, $5::bigint)`,
    ),
    // $1 target, $2 holder, $3 token, $4 cursor xid, $5 cursor position, $6 delivered, $7 lease ms.
    // A read-ahead target's advance, on its own after the broker's confirm: fenced by the token,
    // and it renews the lease.
    advanceNow: q(
      'relay_advance_now',
      `UPDATE ${s}.relay_cursors
          SET cursor_xid = $4::xid8, cursor_position = $5::bigint, delivered = delivered + $6::bigint, delivered_at = now(), updated_at = now(),
              locked_until = now() + $7::bigint ${MS}
        WHERE target = $1 AND holder = $2 AND token = $3::bigint AND (cursor_xid, cursor_position) < ($4::xid8, $5::bigint)`,
    ),
    // $1 cursor xid, $2 cursor position. Past the cursor, with a fence read now: whether a row lies below
    // it (a round would deliver it) and whether a committed row waits behind it. Two index probes of one
    // row each, the first row past the cursor and the first at or past the fence: a count here read
    // every row past the cursor, and after each round of a relay that keeps up with busy publishers
    // those are thousands (29 % of a core of PostgreSQL at 20,000 events/s, session 40). ORDER BY and
    // LIMIT keep each probe on the index in a generic plan (as EXISTS, it read the table).
    afterCursor: q(
      'relay_after_cursor',
      `SELECT f.fence::text AS fence, COALESCE(n.xid < f.fence, false) AS ready, b.xid IS NOT NULL AS waiting
         FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS fence) AS f
         LEFT JOIN LATERAL (
           SELECT o.xid FROM ${s}.outbox AS o
            WHERE (o.xid, o.position) > ($1::xid8, $2::bigint)
            ORDER BY o.xid, o.position LIMIT 1) AS n ON true
         LEFT JOIN LATERAL (
           SELECT o.xid FROM ${s}.outbox AS o
            WHERE (o.xid, o.position) > (GREATEST(f.fence, $1::xid8), CASE WHEN f.fence > $1::xid8 THEN -1::bigint ELSE $2::bigint END)
            ORDER BY o.xid, o.position LIMIT 1) AS b ON true`,
    ),
    // $1 cursor xid, $2 cursor position. How many committed rows lie past the cursor, for the held-back
    // report (at most every 10 s): it reads each of them.
    pastCursor: q('relay_past_cursor', `SELECT count(*)::int AS count FROM ${s}.outbox AS o WHERE (o.xid, o.position) > ($1::xid8, $2::bigint)`),
    // Which outbox this is, for targets that recognise events by (xid, position): the database system
    // (a promoted replica keeps it), the database and the outbox table (a new schema gets a new one).
    origin: q(
      'relay_origin',
      `SELECT c.system_identifier::text || ':' || d.oid::text || ':' || '${s}.outbox'::regclass::oid::text AS origin
         FROM pg_control_system() AS c, pg_database AS d WHERE d.datname = current_database()`,
    ),
    // The oldest transaction with an xid (it holds the fence), other than this session.
    oldestTransaction: q(
      'relay_oldest_transaction',
      `SELECT pid, backend_xid::text AS xid, extract(epoch FROM now() - xact_start)::float8 AS age_seconds,
              datname AS database, application_name
         FROM pg_stat_activity
        WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
        ORDER BY age(backend_xid) DESC LIMIT 1`,
    ),
    // Per target: rows past its cursor (visible ones), the age of the oldest, and how many wait behind the fence.
    cursorStats: q(
      'relay_cursor_stats',
      `SELECT c.target, c.holder, c.locked_until,
              count(o.position)::int AS unpublished,
              COALESCE(extract(epoch FROM now() - min(o.created_at)), 0)::float8 AS lag_seconds,
              count(o.position) FILTER (WHERE o.xid >= pg_snapshot_xmin(pg_current_snapshot()))::int AS behind_fence,
              pg_snapshot_xmin(pg_current_snapshot())::text AS fence,
              (SELECT count(*) FROM ${s}.relay_parked AS p WHERE p.target = c.target)::int AS parked
         FROM ${s}.relay_cursors AS c
         LEFT JOIN ${s}.outbox AS o ON (o.xid, o.position) > (c.cursor_xid, c.cursor_position)
        GROUP BY c.target, c.holder, c.locked_until ORDER BY c.target`,
    ),
    // $1 target, $2 holder, $3 token, $4 position, $5 xid, $6 event id, $7 type, $8 reason, $9 body.
    // Parks an event the target refused for good, fenced by the lease (no row: the lease was lost).
    // An event parked before keeps its first record (the row is returned all the same).
    park: q(
      'relay_park',
      `INSERT INTO ${s}.relay_parked AS p (target, position, xid, event_id, type, reason, body, holder)
       SELECT c.target, $4::bigint, $5::xid8, $6, $7, $8, $9, $2
         FROM ${s}.relay_cursors AS c
        WHERE c.target = $1 AND c.holder = $2 AND c.token = $3::bigint
       ON CONFLICT (target, position) DO UPDATE SET target = p.target
       RETURNING p.position`,
    ),
    // $1 target. Its parked events its cursor has not passed yet.
    parkedAhead: q(
      'relay_parked_ahead',
      `SELECT p.position::text AS position, p.xid::text AS xid
         FROM ${s}.relay_parked AS p JOIN ${s}.relay_cursors AS c ON c.target = p.target
        WHERE p.target = $1 AND (p.xid, p.position) > (c.cursor_xid, c.cursor_position)`,
    ),
  };
}
