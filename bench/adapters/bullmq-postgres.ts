/** BullMQ's PostgreSQL backend (`createPostgresBackend`, BullMQ 6), on a fresh database. */
import pg from 'pg';
import { createDatabase, dropDatabase } from '../db.ts';
import { bullmqAdapter } from './bullmq-common.ts';
import type { Adapter, AdapterContext } from './types.ts';

export function bullmqPostgresAdapter(ctx: AdapterContext): Adapter {
  const dbName = `${ctx.tag}_bullmqpg`;
  return bullmqAdapter({
    id: 'bullmq-postgres',
    label: 'createPostgresBackend, default pool',
    async prepare(bull) {
      const url = await createDatabase(ctx.serverUrl, dbName);
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        await bull.runMigrations(client);
      } finally {
        await client.end();
      }
      return { options: { connection: url }, factory: bull.createPostgresBackend };
    },
    async cleanup() {
      await dropDatabase(ctx.serverUrl, dbName);
    },
  });
}
