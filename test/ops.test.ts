/**
 * The shipped operations files: ops/prometheus/alerts.yml passes
 * `promtool check rules` and its unit tests (`promtool test rules`, each alert
 * firing and not firing); the Grafana dashboard parses; and every metric name
 * the alerts, their tests and the dashboard use is one `mailroom.metrics()`
 * really exposes.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { testDatabases } from './helpers/databases.ts';
import { parseExposition, seriesNames } from './helpers/exposition.ts';

const ops = (path: string) => fileURLToPath(new URL(`../ops/${path}`, import.meta.url));
const ALERTS = ops('prometheus/alerts.yml');
const ALERT_TESTS = ops('prometheus/alerts.test.yml');
const DASHBOARD = ops('grafana/mailroom.json');

/** Why promtool cannot run, or undefined when it can. */
function promtoolMissing(): string | undefined {
  const probe = spawnSync('promtool', ['--version'], { encoding: 'utf8' });
  return probe.error ? 'promtool is not on PATH (install Prometheus\' promtool, e.g. `apt-get install prometheus`, to check the alert rules)' : undefined;
}

const missing = promtoolMissing();
/** Skipped without promtool, except in CI, where the rules must be checked: there the tests fail. */
const skip = missing !== undefined && !process.env.CI ? missing : false;

function promtool(...args: string[]): string {
  if (missing) throw new Error(`${missing}; CI must check the alert rules`);
  const run = spawnSync('promtool', args, { encoding: 'utf8' });
  const output = `${run.stdout}${run.stderr}`;
  assert.equal(run.status, 0, `promtool ${args.join(' ')} failed:\n${output}`);
  return output;
}

/** Metric names in a text: mailroom's own and prom-client's default ones (nodejs_*, process_*). */
function metricNames(text: string): Set<string> {
  return new Set(text.match(/\b(?:mailroom|nodejs|process)_[a-z0-9_]*[a-z0-9]\b/g) ?? []);
}

describe('operations files', () => {
  it('alerts.yml passes promtool check rules', { skip }, () => {
    assert.match(promtool('check', 'rules', ALERTS).replace(/\s+/g, ' '), /SUCCESS: 7 rules found/);
  });

  it('alerts.test.yml: every alert fires and does not fire as its promtool unit tests expect', { skip }, () => {
    assert.match(promtool('test', 'rules', ALERT_TESTS), /SUCCESS/);
  });

  it('every alert has a promtool test where it fires and one where it does not', () => {
    const alerts = [...readFileSync(ALERTS, 'utf8').matchAll(/^\s*- alert: (\S+)$/gm)].map((m) => m[1]!);
    assert.deepEqual(alerts.toSorted(), [
      'MailroomDeadLetters',
      'MailroomDuplicateRateRising',
      'MailroomNoWorkerProgress',
      'MailroomOldestJobTooOld',
      'MailroomRelayEventsParked',
      'MailroomRelayHeldBack',
      'MailroomRelayLag',
    ]);
    const cases = [...readFileSync(ALERT_TESTS, 'utf8').matchAll(/alertname: (\S+)\n\s+exp_alerts:( \[\])?/g)].map((m) => ({ alert: m[1]!, fires: m[2] === undefined }));
    for (const alert of alerts) {
      assert.ok(cases.some((c) => c.alert === alert && c.fires), `${alert}: no test where it fires`);
      assert.ok(cases.some((c) => c.alert === alert && !c.fires), `${alert}: no test where it does not fire`);
    }
  });

  it('the Grafana dashboard parses, and the dashboard, the alerts and their tests use only metrics mailroom exposes', async () => {
    const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { title: string; panels: { type: string; targets?: { expr: string }[] }[] };
    assert.equal(dashboard.title, 'mailroom');
    const exprs = dashboard.panels.flatMap((p) => p.targets ?? []).map((t) => t.expr);
    assert.ok(exprs.length >= 20, `${exprs.length} queries`);

    const { mailroom } = await testDatabases()[0]!.open();
    const exposed = seriesNames(parseExposition(await mailroom.metrics()));
    const used = {
      'ops/grafana/mailroom.json': metricNames(readFileSync(DASHBOARD, 'utf8')),
      'ops/prometheus/alerts.yml': metricNames(readFileSync(ALERTS, 'utf8')),
      'ops/prometheus/alerts.test.yml': metricNames(readFileSync(ALERT_TESTS, 'utf8')),
    };
    for (const [file, names] of Object.entries(used)) {
      const unknown = [...names].filter((n) => !exposed.has(n));
      assert.deepEqual(unknown, [], `${file} uses metrics mailroom.metrics() does not expose`);
    }
    // Every mailroom metric is on the dashboard.
    const onDashboard = used['ops/grafana/mailroom.json'];
    const mine = [...exposed].filter((n) => n.startsWith('mailroom_') && !/_(bucket|count)$/.test(n));
    assert.deepEqual(
      mine.filter((n) => !onDashboard.has(n) && !(n === 'mailroom_job_duration_seconds' && onDashboard.has('mailroom_job_duration_seconds_bucket'))),
      [],
      'mailroom metrics missing from the dashboard',
    );
  });
});
