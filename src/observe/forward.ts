/**
 * Carries the events of the workers, relays and consumers a mailroom made
 * onto the mailroom itself (`mailroom.on('job.completed', …)`), in the shape
 * of {@link MailroomEvents}. Each forwarder allocates only when the mailroom
 * has a listener for that event.
 */
import type { SafetyWarning } from '../brokers/safety.ts';
import type { Consumer } from '../consumers/consumer.ts';
import type { Relay } from '../relay/relay.ts';
import type { Worker } from '../worker/worker.ts';
import type { RescuedJob } from '../worker/maintenance.ts';
import type { EventOrigin, MailroomEvents } from './lifecycle.ts';
import type { EventEmitter } from 'node:events';
import type { SafeEmitter } from './safe-emitter.ts';

type Bus = SafeEmitter<MailroomEvents>;
type EventName = keyof MailroomEvents;

/**
 * Attaches forwarders only once the mailroom has a listener for what they
 * forward: until someone listens to `job.started`, a worker's `started` has no
 * listener and allocates nothing per job. One `newListener` hook per mailroom.
 */
export class LazyForwarding {
  private readonly pending = new Map<EventName, (() => void)[]>();

  constructor(private readonly bus: Bus) {
    (bus as unknown as EventEmitter).on('newListener', (name: string | symbol) => {
      const waiting = this.pending.get(name as EventName);
      if (!waiting) return;
      this.pending.delete(name as EventName);
      for (const attach of waiting) attach();
    });
  }

  /** Runs `attach` now if the mailroom listens to any of `names`, else when it first does (once). */
  when(names: readonly EventName[], attach: () => void): void {
    let done = false;
    const once = () => {
      if (done) return;
      done = true;
      attach();
    };
    if (names.some((name) => this.bus.listenerCount(name) > 0)) return once();
    for (const name of names) this.pending.set(name, [...(this.pending.get(name) ?? []), once]);
  }
}
type ErrorSource = { listenerCount(name: 'error'): number };

/**
 * Reports a component's error on the mailroom; when nobody listens there (nor
 * on the component itself), logs it as the component would have.
 */
function reportError(bus: Bus, component: ErrorSource, origin: EventOrigin, error: unknown): void {
  if (bus.listenerCount('error') > 0) bus.emit('error', { origin, error });
  else if (component.listenerCount('error') <= 1) {
    console.error(`[mailroom] ${origin.component}${origin.name ? ` ${origin.name}` : ''}:`, error instanceof Error ? error.message : error);
  }
}

function reportWarning(bus: Bus, component: { listenerCount(name: 'warning'): number }, origin: EventOrigin, warning: SafetyWarning): void {
  if (bus.listenerCount('warning') > 0) bus.emit('warning', { ...warning, origin });
  else if (component.listenerCount('warning') <= 1) {
    console.warn(`[mailroom] ${origin.component}${origin.name ? ` ${origin.name}` : ''}: ${warning.subject}: ${warning.message} (${warning.code})`);
  }
}

/** Forwards a worker's job events (and, unless a consumer reports them, its errors). */
export function forwardWorker(worker: Worker, bus: Bus, lazy: LazyForwarding, options: { errors: boolean }): void {
  lazy.when(['job.started'], () =>
    worker.on('started', (job) => {
      if (bus.listenerCount('job.started') > 0) bus.emit('job.started', { ...job, worker: worker.id });
    }),
  );
  lazy.when(['job.completed'], () =>
    worker.on('completed', (job) => {
      if (bus.listenerCount('job.completed') > 0) bus.emit('job.completed', job);
    }),
  );
  lazy.when(['job.failed', 'job.dead-lettered'], () =>
    worker.on('failed', (job, detail) => {
      if (bus.listenerCount('job.failed') > 0) {
        bus.emit('job.failed', {
          ...job,
          category: detail.category,
          message: detail.message,
          willRetry: detail.willRetry,
          runAt: detail.runAt,
          durationMs: detail.durationMs,
        });
      }
      if (detail.dead && bus.listenerCount('job.dead-lettered') > 0) {
        bus.emit('job.dead-lettered', { ...job, category: detail.category, message: detail.message });
      }
    }),
  );
  lazy.when(['job.snoozed'], () =>
    worker.on('snoozed', (job, delayMs) => {
      if (bus.listenerCount('job.snoozed') > 0) bus.emit('job.snoozed', { ...job, delayMs });
    }),
  );
  lazy.when(['job.cancelled'], () =>
    worker.on('cancelled', (job, reason) => {
      if (bus.listenerCount('job.cancelled') > 0) bus.emit('job.cancelled', { ...job, reason });
    }),
  );
  lazy.when(['job.rate-limited'], () =>
    worker.on('rate-limited', (job, delayMs) => {
      if (bus.listenerCount('job.rate-limited') > 0) bus.emit('job.rate-limited', { ...job, delayMs });
    }),
  );
  lazy.when(['job.stale'], () =>
    worker.on('stale', (job) => {
      if (bus.listenerCount('job.stale') > 0) bus.emit('job.stale', job);
    }),
  );
  if (options.errors) worker.on('error', (error) => reportError(bus, worker, { component: 'worker', name: worker.id }, error));
}

/** Forwards a relay's deliveries, hold-backs, warnings and errors. */
export function forwardRelay(relay: Relay, bus: Bus, lazy: LazyForwarding): void {
  lazy.when(['relay.published'], () =>
    relay.on('delivered', (info) => {
      if (bus.listenerCount('relay.published') > 0) bus.emit('relay.published', { target: info.target, count: info.count });
    }),
  );
  lazy.when(['relay.held-back'], () =>
    relay.on('held-back', (info) => {
      if (bus.listenerCount('relay.held-back') > 0) bus.emit('relay.held-back', info);
    }),
  );
  lazy.when(['relay.parked'], () =>
    relay.on('parked', (info) => {
      if (bus.listenerCount('relay.parked') > 0) bus.emit('relay.parked', info);
    }),
  );
  relay.on('warning', (warning) => reportWarning(bus, relay, { component: 'relay', name: warning.subject }, warning));
  relay.on('error', (error) => reportError(bus, relay, { component: 'relay' }, error));
}

/** Forwards a consumer group's duplicates, warnings and errors (its job events come from its worker). */
export function forwardConsumer(consumer: Consumer, bus: Bus, lazy: LazyForwarding): void {
  lazy.when(['consumer.duplicate'], () =>
    consumer.on('duplicate', (event) => {
      if (bus.listenerCount('consumer.duplicate') > 0) bus.emit('consumer.duplicate', event);
    }),
  );
  consumer.on('warning', (warning) => reportWarning(bus, consumer, { component: 'consumer', name: consumer.group }, warning));
  consumer.on('error', (error) => reportError(bus, consumer, { component: 'consumer', name: consumer.group }, error));
}

/** Reports a rescued job (and, when it ran out of attempts, its dead-lettering). */
export function emitRescued(bus: Bus, job: RescuedJob): void {
  if (bus.listenerCount('job.rescued') > 0) bus.emit('job.rescued', job);
  if (job.dead && bus.listenerCount('job.dead-lettered') > 0) {
    bus.emit('job.dead-lettered', { ...job, correlationId: null, category: 'lease-expired', message: 'lease expired on the last attempt' });
  }
}
