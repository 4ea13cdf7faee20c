/** The dashboard's options, checked. */
import { randomBytes } from 'node:crypto';
import { ValidationError } from '../errors.ts';

/** Options of {@link createDashboard}. */
export interface DashboardOptions {
  /**
   * The secret every API request must carry (`Authorization: Bearer <token>`):
   * at least 16 characters. Default: a random one, shown in `dashboard.url`.
   */
  token?: string;
  /** Show everything, change nothing: replay and discard answer 403. Default false. */
  readOnly?: boolean;
}

export interface ResolvedDashboardOptions {
  token: string;
  readOnly: boolean;
  /** True when the token was made here (the URL to open carries it). */
  generatedToken: boolean;
}

const MIN_TOKEN = 16;

/** What every dashboard token must be, for messages: `token ${DASHBOARD_TOKEN_RULE}`. */
export const DASHBOARD_TOKEN_RULE = `must be a string of at least ${MIN_TOKEN} characters without spaces`;

/** Why `token` is refused (`has 5 characters`), or undefined when it is a good token. Never repeats the token. */
export function dashboardTokenProblem(token: unknown): string | undefined {
  if (typeof token !== 'string') return `got ${token === null ? 'null' : typeof token}`;
  if (token.length < MIN_TOKEN) return `it has ${token.length} character${token.length === 1 ? '' : 's'}`;
  if (/\s/.test(token)) return 'it contains whitespace';
  return undefined;
}

export function resolveDashboardOptions(options: DashboardOptions): ResolvedDashboardOptions {
  const invalid = (path: string, message: string) => new ValidationError(`dashboard: ${message}`, [{ path, message }]);
  if (typeof options !== 'object' || options === null) throw invalid('options', 'options must be an object');
  if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean') throw invalid('readOnly', `readOnly must be true or false, got ${JSON.stringify(options.readOnly)}`);
  const tokenProblem = options.token === undefined ? undefined : dashboardTokenProblem(options.token);
  if (tokenProblem !== undefined) throw invalid('token', `token ${DASHBOARD_TOKEN_RULE} (e.g. from openssl rand -hex 24); ${tokenProblem}`);
  return {
    token: options.token ?? randomBytes(24).toString('hex'),
    readOnly: options.readOnly === true,
    generatedToken: options.token === undefined,
  };
}
