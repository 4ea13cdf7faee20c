#!/usr/bin/env node
// The `mailroom` command: runs the compiled CLI in dist/ (built by `npm run build` or on install).
try {
  await import('../dist/cli/main.js');
} catch (error) {
  if (error && error.code === 'ERR_MODULE_NOT_FOUND' && String(error.message).includes('dist/cli/main.js')) {
    console.error('mailroom: the compiled CLI (dist/cli/main.js) is missing; run `npm run build` in the mailroom package first');
    process.exit(1);
  }
  throw error;
}
