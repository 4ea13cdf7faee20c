/** The systems under test, by id, in the order the report lists them. */
import { bullmqPostgresAdapter } from './bullmq-postgres.ts';
import { bullmqRedisAdapter } from './bullmq-redis.ts';
import { graphileWorkerAdapter } from './graphile-worker.ts';
import { mailroomAdapter } from './mailroom.ts';
import { pgBossAdapter } from './pg-boss.ts';
import type { Adapter, AdapterContext } from './types.ts';

export const SYSTEMS = ['mailroom', 'graphile-worker', 'pg-boss', 'bullmq-redis', 'bullmq-postgres'] as const;
export type SystemId = (typeof SYSTEMS)[number];

const factories: Record<SystemId, (ctx: AdapterContext) => Adapter> = {
  mailroom: mailroomAdapter,
  'graphile-worker': graphileWorkerAdapter,
  'pg-boss': pgBossAdapter,
  'bullmq-redis': bullmqRedisAdapter,
  'bullmq-postgres': bullmqPostgresAdapter,
};

export function isSystemId(value: string): value is SystemId {
  return (SYSTEMS as readonly string[]).includes(value);
}

export function makeAdapter(id: SystemId, ctx: AdapterContext): Adapter {
  return factories[id](ctx);
}

/** Which systems store their jobs in PostgreSQL (the others cannot be compared with its ceiling). */
export const ON_POSTGRES: Record<SystemId, boolean> = {
  mailroom: true,
  'graphile-worker': true,
  'pg-boss': true,
  'bullmq-redis': false,
  'bullmq-postgres': true,
};
