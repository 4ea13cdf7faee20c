/**
 * The health verdict of `mailroom status --check`: which numbers of
 * `mailroom.stats()` cross a threshold.
 */
import { INTERNAL_TARGET } from '../relay/internal-target.ts';
import type { MailroomStats } from '../stats.ts';
import { formatAge } from './format.ts';

/** Limits past which `status --check` calls mailroom unhealthy. */
export interface HealthThresholds {
  /** Age of the oldest waiting job of any queue, in seconds. */
  maxAgeSeconds: number;
  /** Dead letters of any one queue. */
  maxDead: number;
  /** Lag of any relay target, and of the events a consumer group is still waiting for, in seconds. */
  maxLagSeconds: number;
}

/** The defaults `status --check` uses, as written on the command line. */
export const DEFAULT_THRESHOLDS = { maxAge: '5m', maxDead: 0, maxLag: '60s' } as const;

/** One threshold crossed. */
export interface FailedCheck {
  check: 'max-age' | 'max-dead' | 'max-lag';
  /** What crossed it: `queue email`, `relay target internal`, `consumer group billing`. */
  subject: string;
  value: number;
  limit: number;
  /** For people, e.g. `queue email: 2 dead letters, more than --max-dead 0`. */
  message: string;
}

/**
 * Every threshold the stats cross, queues first, then relay targets, then
 * consumer groups; empty when healthy. A consumer group fed by the relay
 * lags when the `internal` target has not delivered its events yet; its
 * queue's waiting jobs count under --max-age like any queue's.
 *
 * @example
 * checkHealth(await mailroom.stats(), { maxAgeSeconds: 300, maxDead: 0, maxLagSeconds: 60 }) // []
 */
export function checkHealth(stats: MailroomStats, limits: HealthThresholds): FailedCheck[] {
  const failed: FailedCheck[] = [];
  const age = (s: number) => formatAge(s);
  for (const [queue, q] of Object.entries(stats.queues).sort(([a], [b]) => a.localeCompare(b))) {
    if (q.oldestAgeSeconds > limits.maxAgeSeconds) {
      failed.push({
        check: 'max-age',
        subject: `queue ${queue}`,
        value: q.oldestAgeSeconds,
        limit: limits.maxAgeSeconds,
        message: `queue ${queue}: the oldest waiting job has been due for ${age(q.oldestAgeSeconds)}, longer than --max-age ${age(limits.maxAgeSeconds)} (${q.available} waiting, ${q.active} running)`,
      });
    }
    if (q.dead > limits.maxDead) {
      failed.push({
        check: 'max-dead',
        subject: `queue ${queue}`,
        value: q.dead,
        limit: limits.maxDead,
        message: `queue ${queue}: ${q.dead} dead letter${q.dead === 1 ? '' : 's'}, more than --max-dead ${limits.maxDead}`,
      });
    }
  }
  for (const [target, r] of Object.entries(stats.relay).sort(([a], [b]) => a.localeCompare(b))) {
    if (r.lagSeconds > limits.maxLagSeconds) {
      const held = r.heldBackBy ? `; held back by ${r.heldBackBy.pid === null ? 'an open transaction' : `the open transaction of pid ${r.heldBackBy.pid}`}` : '';
      const idle = r.holder === null ? '; no relay holds this target' : '';
      failed.push({
        check: 'max-lag',
        subject: `relay target ${target}`,
        value: r.lagSeconds,
        limit: limits.maxLagSeconds,
        message: `relay target ${target}: ${r.unpublished} unpublished event${r.unpublished === 1 ? '' : 's'}, the oldest for ${age(r.lagSeconds)}, longer than --max-lag ${age(limits.maxLagSeconds)}${held}${idle}`,
      });
    }
    // Parked events are the relay's dead letters: refused by the target for good, never delivered to it.
    if (r.parked > limits.maxDead) {
      failed.push({
        check: 'max-dead',
        subject: `relay target ${target}`,
        value: r.parked,
        limit: limits.maxDead,
        message: `relay target ${target}: ${r.parked} parked event${r.parked === 1 ? '' : 's'} (refused by the target for good: mailroom parked list ${target}), more than --max-dead ${limits.maxDead}`,
      });
    }
  }
  const internalLag = stats.relay[INTERNAL_TARGET]?.lagSeconds ?? 0;
  for (const [group, g] of Object.entries(stats.consumers).sort(([a], [b]) => a.localeCompare(b))) {
    if (g.source === null && g.unrelayed > 0 && internalLag > limits.maxLagSeconds) {
      failed.push({
        check: 'max-lag',
        subject: `consumer group ${group}`,
        value: internalLag,
        limit: limits.maxLagSeconds,
        message: `consumer group ${group}: ${g.unrelayed} event${g.unrelayed === 1 ? '' : 's'} not delivered to it yet, waiting up to ${age(internalLag)}, longer than --max-lag ${age(limits.maxLagSeconds)} (is a relay running?)`,
      });
    }
  }
  return failed;
}
