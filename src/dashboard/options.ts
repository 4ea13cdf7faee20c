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

export function resolveDashboardOptions(options: DashboardOptions): ResolvedDashboardOptions {
  const invalid = (path: string, message: string) => new ValidationError(`dashboard: ${message}`, [{ path, message }]);
  if (typeof options !== 'object' || options === null) throw invalid('options', 'options must be an object');
  if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean') throw invalid('readOnly', `readOnly must be true or false, got ${JSON.stringify(options.readOnly)}`);
  if (options.token !== undefined && (typeof options.token !== 'string' || options.token.length < MIN_TOKEN || /\s/.test(options.token))) {
    throw invalid('token', `token must be a string of at least ${MIN_TOKEN} characters without spaces (e.g. from openssl rand -hex 24)`);
  }
  return {
    token: options.token ?? randomBytes(24).toString('hex'),
    readOnly: options.readOnly === true,
    generatedToken: options.token === undefined,
  };
}
