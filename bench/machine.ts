/** What the figures were measured on: machine, load, PostgreSQL, Redis, versions. */
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import { serverInfo, type ServerInfo } from './db.ts';
import { loadPeer } from './load-peer.ts';

export interface MachineInfo {
  cpus: number;
  cpuModel: string;
  memoryGiB: number;
  platform: string;
  node: string;
  loadAtStart: number[];
  loadAtEnd: number[];
  postgres: ServerInfo;
  redis: { version: string; appendonly: string; save: string } | { error: string };
  versions: Record<string, string>;
}

interface RedisClient {
  info(section: string): Promise<string>;
  config(op: 'GET', name: string): Promise<string[]>;
  quit(): Promise<unknown>;
  on(event: 'error', listener: (e: unknown) => void): void;
}

async function redisInfo(redisUrl: string): Promise<MachineInfo['redis']> {
  try {
    const mod = await loadPeer<{ Redis: new (url: string, opts: Record<string, unknown>) => RedisClient }>('ioredis');
    const r = new mod.Redis(redisUrl, { lazyConnect: false, maxRetriesPerRequest: 1 });
    r.on('error', () => {});
    try {
      const info = await r.info('server');
      const version = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
      const [, appendonly = '?'] = await r.config('GET', 'appendonly');
      const [, save = '?'] = await r.config('GET', 'save');
      return { version, appendonly, save: save === '' ? '(none)' : save };
    } finally {
      await r.quit().catch(() => {});
    }
  } catch (error) {
    return { error: error instanceof Error ? error.message : String(error) };
  }
}

async function versionOf(pkg: string): Promise<string> {
  for (const base of ['./node_modules/', '../node_modules/']) {
    try {
      const json = JSON.parse(await readFile(new URL(`${base}${pkg}/package.json`, import.meta.url), 'utf8')) as { version: string };
      return json.version;
    } catch {
      // try the next place
    }
  }
  return 'not installed';
}

export async function machineInfo(serverUrl: string, redisUrl: string): Promise<MachineInfo> {
  const mailroom = JSON.parse(await readFile(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
  return {
    cpus: os.availableParallelism(),
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    platform: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    loadAtStart: os.loadavg().map((v) => Math.round(v * 100) / 100),
    loadAtEnd: [],
    postgres: await serverInfo(serverUrl),
    redis: await redisInfo(redisUrl),
    versions: {
      mailroom: `${mailroom.version} (this working tree)`,
      'graphile-worker': await versionOf('graphile-worker'),
      'pg-boss': await versionOf('pg-boss'),
      bullmq: await versionOf('bullmq'),
      ioredis: await versionOf('ioredis'),
      pg: await versionOf('pg'),
    },
  };
}
