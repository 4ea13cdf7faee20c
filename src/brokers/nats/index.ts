/**
 * `mailroom/nats`: NATS JetStream as a relay target (`nats`) and as a consumer
 * group's source (`natsSource`). Needs `@nats-io/transport-node` and
 * `@nats-io/jetstream` (3.x) installed next to mailroom.
 *
 * @example
 * import { nats, natsSource } from 'mailroom/nats';
 * const relay = mailroom.relay({ to: [nats({ url: 'nats://127.0.0.1:4222', stream: 'orders' })] });
 * const billing = mailroom.consumer({ group: 'billing', source: natsSource({ url: 'nats://127.0.0.1:4222', stream: 'orders' }), handlers });
 */
export { nats, NatsTarget } from './target.ts';
export { natsSource, NatsSource } from './source.ts';
export type { NatsTargetOptions, NatsSourceOptions, NatsStartFrom } from './options.ts';
