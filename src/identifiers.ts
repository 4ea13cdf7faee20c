import { ValidationError } from './errors.ts';

const SQL_IDENTIFIER = /^[a-z_][a-z0-9_]{0,49}$/;
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$/;

/**
 * Validates a PostgreSQL schema name: lower-case letters, digits and `_`,
 * starting with a letter or `_`, at most 50 characters (room for a NOTIFY channel suffix). Returns it quoted.
 *
 * @example
 * quoteSchema('mailroom') // '"mailroom"'
 */
export function quoteSchema(schema: string): string {
  if (typeof schema !== 'string' || !SQL_IDENTIFIER.test(schema)) {
    throw new ValidationError(
      `schema: ${JSON.stringify(schema)} is not a valid schema name; use 1-50 lower-case letters, digits or '_', starting with a letter or '_'`,
      [{ path: 'schema', message: 'invalid identifier' }],
    );
  }
  return `"${schema}"`;
}

/**
 * Validates a queue or job name: 1-128 characters of letters, digits and
 * `_ . : -`, starting with a letter or digit. Names are stored as values,
 * never spliced into SQL, but a strict shape keeps logs, metrics and URLs sane.
 *
 * @example
 * assertName('email.welcome', 'job name')
 */
export function assertName(name: unknown, what: string): asserts name is string {
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new ValidationError(
      `${what}: ${JSON.stringify(name)} is not valid; use 1-128 characters of letters, digits, '_', '.', ':' or '-', starting with a letter or digit`,
      [{ path: what, message: 'invalid name' }],
    );
  }
}
