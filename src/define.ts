import type { StandardSchemaV1 } from '@standard-schema/spec';
import { toMilliseconds, type Duration } from './duration.ts';
import { assertName } from './identifiers.ts';
import { resolveRetryPolicy, type RetryOptions, type RetryPolicy } from './retry/backoff.ts';
import { defaultClassifier, type ErrorClassifier } from './retry/classify.ts';
import { registerJob } from './registry.ts';
import type { JobHandler } from './worker/types.ts';
import { ValidationError } from './errors.ts';

/** Options of {@link defineJob}. */
export interface JobOptions<TSchema extends StandardSchemaV1 | undefined = undefined> {
  /** Queue the job goes to. Default `'default'`. */
  queue?: string;
  /** Any Standard Schema validator (zod, valibot, arktype); checked at enqueue. */
  schema?: TSchema;
  retry?: RetryOptions;
  /** Abort the handler (via `ctx.signal`) and count a `timeout` failure after this long. No limit by default. */
  timeout?: Duration;
  /** Replaces the default classifier of failures for this job type. */
  classify?: ErrorClassifier;
  /**
   * Per-key ordering: when a job with an ordering key is dead-lettered, `'continue'`
   * (default) lets the next job of its key run; `'hold'` keeps the key blocked
   * until an operator replays or discards the dead job.
   */
  ordering?: { onDead?: 'continue' | 'hold' };
}

/** A job type: its name, queue, payload schema and retry policy. Made by {@link defineJob}. */
export interface JobDefinition<TData = unknown, TInput = TData> {
  readonly kind: 'job';
  readonly name: string;
  readonly queue: string;
  readonly schema: StandardSchemaV1<TInput, TData> | undefined;
  readonly retry: RetryPolicy;
  readonly timeoutMs: number | null;
  readonly classify: ErrorClassifier;
  readonly ordering: { readonly onDead: 'continue' | 'hold' };
}

/** The payload type a job definition's handler receives. */
export type JobData<D> = D extends JobDefinition<infer T, unknown> ? T : never;
/** The payload type `enqueue` accepts for a job definition. */
export type JobInput<D> = D extends JobDefinition<unknown, infer I> ? I : never;

/**
 * Defines a job type and registers it by name, so that workers in this process
 * apply its retry policy, timeout and classifier. Pass a schema to validate payloads at enqueue and to
 * type them; without one, give the payload type as a type argument.
 *
 * @example
 * export const sendWelcome = defineJob('email.welcome', {
 *   queue: 'email',
 *   schema: z.object({ userId: z.string() }),
 *   retry: { maxAttempts: 5, backoff: { base: '2s', max: '10m' }, maxAge: '1d' },
 *   timeout: '30s',
 * });
 */
export function defineJob<TSchema extends StandardSchemaV1>(
  name: string,
  options: JobOptions<TSchema> & { schema: TSchema },
): JobDefinition<StandardSchemaV1.InferOutput<TSchema>, StandardSchemaV1.InferInput<TSchema>>;
export function defineJob<TData = unknown>(name: string, options?: JobOptions<undefined>): JobDefinition<TData, TData>;
export function defineJob(name: string, options: JobOptions<StandardSchemaV1 | undefined> = {}): JobDefinition<unknown, unknown> {
  assertName(name, 'job name');
  const queue = options.queue ?? 'default';
  assertName(queue, `queue of job ${name}`);
  const schema = options.schema;
  if (schema !== undefined && (typeof schema !== 'object' || schema === null || !('~standard' in schema))) {
    throw new TypeError(`job ${name}: schema must be a Standard Schema validator (zod, valibot, arktype, ...)`);
  }
  const def: JobDefinition<unknown, unknown> = Object.freeze({
    kind: 'job' as const,
    name,
    queue,
    schema,
    retry: resolveRetryPolicy(options.retry, `job ${name}`),
    timeoutMs: options.timeout === undefined ? null : toMilliseconds(options.timeout, `job ${name}: timeout`),
    classify: options.classify ?? defaultClassifier,
    ordering: Object.freeze({ onDead: checkOnDead(options.ordering?.onDead, name) }),
  });
  registerJob(def);
  return def;
}

function checkOnDead(value: unknown, name: string): 'continue' | 'hold' {
  if (value === undefined || value === 'continue' || value === 'hold') return value ?? 'continue';
  throw new ValidationError(`job ${name}: ordering.onDead must be 'continue' or 'hold', got ${JSON.stringify(value)}`, [
    { path: 'ordering.onDead', message: 'invalid' },
  ]);
}

/**
 * Types a handler by its job definition, so `job.data` has the payload type.
 *
 * @example
 * mailroom.worker({ queues: ['email'], handlers: { [sendWelcome.name]: handle(sendWelcome, async (job) => send(job.data.email)) } });
 */
export function handle<TData, TInput>(def: JobDefinition<TData, TInput>, handler: JobHandler<TData>): JobHandler<TData> {
  void def;
  return handler;
}
