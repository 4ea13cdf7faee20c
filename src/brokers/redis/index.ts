/**
 * `mailroom/redis`: Redis Streams as a relay target (`redisStreams`) and as a
 * consumer group's source (`redisSource`). Needs the `ioredis` package.
 * See docs/brokers/redis.md.
 */
export { redisStreams } from './target.ts';
export { redisSource } from './source.ts';
export type { RedisSourceOptions, RedisTargetOptions } from './options.ts';
