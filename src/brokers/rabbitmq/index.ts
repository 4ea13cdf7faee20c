/**
 * `mailroom/rabbitmq`: a relay target publishing outbox events to a RabbitMQ
 * exchange, and a consumer source reading a RabbitMQ queue into a consumer
 * group. Needs the `amqplib` package (an optional peer dependency).
 *
 * @example
 * import { rabbitmq, rabbitmqSource } from 'mailroom/rabbitmq';
 * const relay = mailroom.relay({ to: [rabbitmq({ url, exchange: 'events' })] });
 * const billing = mailroom.consumer({ group: 'billing', source: rabbitmqSource({ url, queue: 'billing', declare: { exchange: 'events' } }), handlers });
 */
export { rabbitmq } from './target.ts';
export type { RabbitMqTarget } from './target.ts';
export { rabbitmqSource } from './source.ts';
export type { RabbitMqSource } from './source.ts';
export type { RabbitMqTargetOptions, RabbitMqSourceOptions, RabbitMqDeclareOptions } from './options.ts';
