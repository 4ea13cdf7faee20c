import { MailroomError } from '../errors.ts';

/**
 * Adds how-to-fix advice to database errors mailroom's users commonly meet;
 * returns other errors unchanged.
 */
export function explainDatabaseError(error: unknown, schema: string): Error {
  if (!(error instanceof Error)) return new MailroomError(String(error));
  const code = (error as { code?: unknown }).code;
  if (code === '42P01' || code === '3F000') {
    const explained = new MailroomError(
      `mailroom's tables are missing in schema "${schema}" (${error.message}); run \`await mailroom.migrate()\` or \`npx mailroom migrate\` first`,
      { cause: error },
    );
    return explained;
  }
  return error;
}
