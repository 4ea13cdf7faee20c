/**
 * Entry of the `mailroom` command (bin/mailroom.js imports the built copy;
 * `tsx src/cli/main.ts` runs it from source): runs the command line of this
 * process and exits with its code. The command line itself is `main()` in
 * program.ts, which can be imported (and called in process) without running.
 */
import { main } from './program.ts';

const exitCode = await main(process.argv.slice(2));
process.exitCode = exitCode;
// Everything the commands open is closed; should a stray handle remain, do not hang.
setTimeout(() => process.exit(exitCode), 2000).unref();
