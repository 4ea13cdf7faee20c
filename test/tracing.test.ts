/**
 * Following one request (PGlite, and PostgreSQL with TEST_DATABASE_URL): the
 * correlation id and the trace travel from the request into a job, from its
 * handler into an outbox event, through the relay into a consumer group's job,
 * and from that handler into one more job; mailroom's log lines and
 * `logContext()` carry the correlation id. A real OpenTelemetry SDK (in-memory
 * exporter) records the spans.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { Writable } from 'node:stream';
import pino from 'pino';
import { defineEvent, defineJob, handleEvent, logContext, PermanentError, withCorrelation, type Job } from '../src/index.ts';
import { testDatabases } from './helpers/databases.ts';
import { eventually, waitForEvents } from './helpers/events.ts';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const contextManager = new AsyncLocalStorageContextManager().enable();
context.setGlobalContextManager(contextManager);
trace.setGlobalTracerProvider(provider);
after(async () => {
  await provider.shutdown();
  contextManager.disable();
});

function parentOf(span: ReadableSpan): string | undefined {
  return span.parentSpanContext?.spanId;
}

for (const db of testDatabases()) {
  describe(`one request followed through mailroom on ${db.name}`, () => {
    it('correlation id, causation id and one trace from a request to a job, an event, the relay, a consumer and a job it enqueues', async () => {
      exporter.reset();
      const lines: { level: string; fields: Record<string, unknown>; message: string }[] = [];
      const logAt = (level: string) => (fields: Record<string, unknown>, message: string) => void lines.push({ level, fields, message });
      const logger = { error: logAt('error'), warn: logAt('warn'), info: logAt('info'), debug: logAt('debug') };
      const t = await db.open({ logger });
      const { mailroom } = t;
      const n = db.name;
      const signup = defineJob<{ user: string }>(`trace.signup.${n}`, { queue: 'trace-signup' });
      const followUp = defineJob<{ user: string }>(`trace.follow-up.${n}`, { queue: 'trace-follow', retry: { maxAttempts: 2, backoff: { base: 1, max: 1 } } });
      const signedUp = defineEvent<{ user: string }>(`trace.signed-up.${n}`, { version: 1 });
      const seenContexts: Record<string, Record<string, string | number>> = {};

      const worker = mailroom.worker({
        queues: ['trace-signup', 'trace-follow'],
        pollInterval: 10,
        handlers: {
          [signup.name]: async (job: Job<{ user: string }>, ctx) => {
            seenContexts.signup = logContext();
            await mailroom.publish(signedUp, { user: job.data.user }, { tx: ctx.tx, key: job.data.user });
          },
          [followUp.name]: (job: Job<{ user: string }>) => {
            seenContexts.followUp = logContext();
            if (job.attempt === 1) throw new Error('mail server busy');
          },
        },
      });
      const consumer = mailroom.consumer({
        group: 'trace-welcome',
        pollInterval: 10,
        handlers: {
          [signedUp.type]: handleEvent(signedUp, async (event) => {
            seenContexts.consumer = logContext();
            await mailroom.enqueue(followUp, { user: event.data.user });
          }),
        },
      });
      const relay = mailroom.relay({ pollInterval: 10 });
      const followUpDone = new Promise<string>((resolve) => mailroom.on('job.completed', (j) => j.type === followUp.name && resolve(j.id)));
      await Promise.all([worker.start(), consumer.start(), relay.start()]);

      // The request: a traced HTTP handler that enqueues, with no correlationId option.
      const tracer = trace.getTracer('test-app');
      const { jobId, rootSpan } = await withCorrelation('req-7', () =>
        tracer.startActiveSpan('POST /signup', async (span) => {
          const id = await mailroom.enqueue(signup, { user: 'ada' });
          span.end();
          return { jobId: id, rootSpan: span.spanContext() };
        }),
      );
      const followUpId = await followUpDone;
      await Promise.all([relay.stop(), consumer.stop(), worker.stop()]);

      // Correlation: on every row the request caused.
      const jobs = await t.sql<{ id: string; queue: string; correlation_id: string | null }>(
        `SELECT id, queue, correlation_id FROM "${t.schema}".jobs ORDER BY created_at`,
      );
      assert.deepEqual(
        jobs.map((j) => [j.queue, j.correlation_id]),
        [
          ['trace-signup', 'req-7'],
          ['consumer.trace-welcome', 'req-7'],
          ['trace-follow', 'req-7'],
        ],
      );
      const events = await t.sql<{ id: string; correlation_id: string; causation_id: string; traceparent: string | null }>(
        `SELECT id, correlation_id, causation_id, traceparent FROM "${t.schema}".outbox`,
      );
      assert.equal(events.length, 1);
      assert.equal(events[0]!.correlation_id, 'req-7');
      assert.equal(events[0]!.causation_id, jobId, 'the event names the job whose handler published it as its cause');
      const consumerJob = jobs.find((j) => j.queue === 'consumer.trace-welcome')!;
      assert.equal(seenContexts.signup?.correlationId, 'req-7');
      assert.equal(seenContexts.signup?.jobId, jobId);
      assert.equal(seenContexts.consumer?.correlationId, 'req-7');
      assert.equal(seenContexts.consumer?.eventId, events[0]!.id);
      assert.equal(seenContexts.consumer?.jobId, consumerJob.id);
      assert.equal(seenContexts.followUp?.jobId, followUpId);
      assert.equal(seenContexts.followUp?.correlationId, 'req-7');
      assert.deepEqual(logContext(), {}, 'outside of handlers there is no context');

      // mailroom's own log line about the failed first attempt carries the correlation id.
      const retryLine = lines.find((l) => l.level === 'warn' && l.message.includes('will retry'));
      assert.equal(retryLine?.fields.correlationId, 'req-7');
      assert.equal(retryLine?.fields.jobId, followUpId);
      assert.ok(lines.some((l) => l.level === 'debug' && l.message.includes('completed') && l.fields.jobId === followUpId));

      // One trace: request → enqueue → process → publish → (relay, linked) → process (consumer) → enqueue → process.
      await eventually(() => exporter.getFinishedSpans().filter((s) => s.name === `process ${followUp.name}`).length === 2, 5000, 'the spans');
      const spans = exporter.getFinishedSpans();
      const one = (name: string) => {
        const found = spans.filter((s) => s.name === name);
        assert.equal(found.length, 1, `one span named ${name}; spans: ${spans.map((s) => s.name).join(', ')}`);
        return found[0]!;
      };
      const enqueueSignup = one(`enqueue ${signup.name}`);
      const processSignup = one(`process ${signup.name}`);
      const publish = one(`publish ${signedUp.type}`);
      const processEvent = one(`process ${signedUp.type}`);
      const enqueueFollowUp = one(`enqueue ${followUp.name}`);
      const processFollowUps = spans.filter((s) => s.name === `process ${followUp.name}`);
      const relaySpans = spans.filter((s) => s.name === 'relay internal');
      for (const s of [enqueueSignup, processSignup, publish, processEvent, enqueueFollowUp, ...processFollowUps]) {
        assert.equal(s.spanContext().traceId, rootSpan.traceId, `${s.name} is in the request's trace`);
      }
      assert.equal(parentOf(enqueueSignup), rootSpan.spanId);
      assert.equal(parentOf(processSignup), enqueueSignup.spanContext().spanId);
      assert.equal(parentOf(publish), processSignup.spanContext().spanId);
      assert.equal(parentOf(processEvent), publish.spanContext().spanId, 'the consumer joins the trace the event carried');
      assert.equal(parentOf(enqueueFollowUp), processEvent.spanContext().spanId);
      for (const s of processFollowUps) assert.equal(parentOf(s), enqueueFollowUp.spanContext().spanId, 'each attempt joins the trace');
      assert.deepEqual(
        processFollowUps.map((s) => [s.attributes['mailroom.attempt'], s.status.code]).sort(),
        [
          [1, 2], // SpanStatusCode.ERROR: the failed first attempt
          [2, 0],
        ],
      );
      assert.ok(
        relaySpans.some((s) => s.links.some((l) => l.context.spanId === publish.spanContext().spanId)),
        'the relay batch links to the publish span',
      );
      assert.equal(events[0]!.traceparent, `00-${rootSpan.traceId}-${publish.spanContext().spanId}-01`);
    });

    it('an explicit correlationId wins over the context; enqueue without a context or option has none', async () => {
      const t = await db.open();
      const job = defineJob(`trace.explicit.${db.name}`, { queue: 'trace-explicit' });
      const [a, b, c] = [
        await withCorrelation('outer', () => t.mailroom.enqueue(job, {}, { correlationId: 'given' })),
        await withCorrelation('outer', () => t.mailroom.enqueue(job, {})),
        await t.mailroom.enqueue(job, {}),
      ];
      const rows = await t.sql<{ id: string; correlation_id: string | null }>(`SELECT id, correlation_id FROM "${t.schema}".jobs`);
      const of = (id: string) => rows.find((r) => r.id === id)?.correlation_id;
      assert.equal(of(a), 'given');
      assert.equal(of(b), 'outer');
      assert.equal(of(c), null);
      assert.throws(() => withCorrelation('', () => 1), /correlationId must be a non-empty string/);
    });
  });
}

describe('mailroom with a real pino logger', () => {
  it("pino as `logger` and `logContext` as pino's mixin: mailroom's lines and the handler's own carry the job and correlation id", async () => {
    const db = testDatabases()[0]!;
    const lines: Record<string, unknown>[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, callback) {
        for (const line of chunk.toString().split('\n')) if (line.trim()) lines.push(JSON.parse(line) as Record<string, unknown>);
        callback();
      },
    });
    const log = pino({ level: 'debug', mixin: logContext }, sink);
    const t = await db.open({ logger: log });
    const job = defineJob<{ n: number }>('trace.pino', { queue: 'trace-pino', retry: { maxAttempts: 1 } });
    const worker = t.mailroom.worker({
      queues: ['trace-pino'],
      pollInterval: 10,
      handlers: {
        [job.name]: (j: Job<{ n: number }>) => {
          log.info({ n: j.data.n }, 'handling');
          if (j.data.n === 2) throw new PermanentError('bad input');
        },
      },
    });
    const done = waitForEvents(worker, 'failed', 1);
    const ids = await withCorrelation('req-pino', () => t.mailroom.enqueueMany(job, [{ n: 1 }, { n: 2 }]));
    await worker.start();
    await done;
    await eventually(() => lines.some((l) => l.msg === `job trace.pino completed`), 5000, 'the completed line');
    await worker.stop();
    const handling = lines.filter((l) => l.msg === 'handling');
    assert.deepEqual(handling.map((l) => [l.n, l.jobId, l.correlationId, l.queue]).sort(), [
      [1, ids[0], 'req-pino', 'trace-pino'],
      [2, ids[1], 'req-pino', 'trace-pino'],
    ]);
    const dead = lines.find((l) => l.msg === 'job trace.pino sent to the dead-letter queue');
    assert.equal(dead?.level, 50, 'an error line');
    assert.equal(dead?.jobId, ids[1]);
    assert.equal(dead?.correlationId, 'req-pino');
    assert.equal(dead?.category, 'permanent');
    const completed = lines.find((l) => l.msg === 'job trace.pino completed');
    assert.equal(completed?.level, 20, 'a debug line');
    assert.equal(completed?.jobId, ids[0]);
  });
});
