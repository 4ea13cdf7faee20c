import { MailroomError } from '../errors.ts';

const UNREACHABLE = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ECONNRESET']);

/**
 * Adds how-to-fix advice to database errors mailroom's users commonly meet
 * (tables not migrated, a server that cannot be reached, a database that does
 * not exist, a refused login), naming `location` (the server, password left
 * out); returns other errors unchanged.
 *
 * @example
 * throw explainDatabaseError(error, 'mailroom', 'postgres://app@db:5432/shop');
 */
export function explainDatabaseError(error: unknown, schema: string, location?: string): Error {
  if (!(error instanceof Error)) return new MailroomError(String(error));
  const code = (error as { code?: unknown }).code;
  const at = location === undefined ? '' : ` at ${location}`;
  if (code === '42P01' || code === '3F000') {
    const command = schema === 'mailroom' ? 'npx mailroom migrate' : `npx mailroom migrate --schema ${schema}`;
    return new MailroomError(`mailroom's tables are missing in schema "${schema}" (${error.message}); run \`await mailroom.migrate()\` or \`${command}\` first`, { cause: error });
  }
  if (typeof code === 'string' && UNREACHABLE.has(code)) {
    return new MailroomError(
      `cannot reach PostgreSQL${at}: ${error.message || code}. Check the host and port in the database URL (the \`database\` option or DATABASE_URL) and that the server is running`,
      { cause: error },
    );
  }
  if (code === '3D000') {
    return new MailroomError(`${error.message}${at}: create it (\`createdb NAME\`, or CREATE DATABASE) or fix the database name in the URL`, { cause: error });
  }
  if (code === '28P01' || code === '28000') {
    return new MailroomError(`PostgreSQL refused the login${at}: ${error.message}. Check the user and password in the database URL`, { cause: error });
  }
  return error;
}
