/**
 * A Redis command that mailroom writes in the protocol's bytes itself. ioredis
 * writes a command as one string concatenated from every argument's pieces;
 * for a script call of 100 events (about 600 arguments) that string is a rope
 * of some 3,000 pieces, and flattening it to write it to the socket cost
 * 3.0-3.5 µs of Node CPU per event (measured apart, 1,000 events of the relay's
 * size). Written here into one Buffer (short arguments gathered into one
 * string, long ones written apart), the same bytes cost 1.1-1.9 µs. ioredis's
 * own script commands override `toWritable` the same way.
 */
import { Command, type Redis } from 'ioredis';

/** Arguments at least this long are written into the Buffer on their own; shorter ones join the text around them. */
const LONG_ARGUMENT = 64;

/**
 * A command's name and arguments as a RESP array of bulk strings, in UTF-8
 * (numbers as their decimal text).
 *
 * @example
 * respOf('GET', ['orders']).toString() // '*2\r\n$3\r\nGET\r\n$6\r\norders\r\n'
 */
export function respOf(name: string, args: readonly (string | number)[]): Buffer {
  const pieces: string[] = [];
  let text = `*${args.length + 1}\r\n$${Buffer.byteLength(name)}\r\n${name}\r\n`;
  let length = 0;
  for (const value of args) {
    const arg = typeof value === 'string' ? value : String(value);
    const bytes = Buffer.byteLength(arg);
    text += `$${bytes}\r\n`;
    if (bytes < LONG_ARGUMENT) {
      text += `${arg}\r\n`;
    } else {
      pieces.push(text, arg);
      length += Buffer.byteLength(text) + bytes;
      text = '\r\n';
    }
  }
  pieces.push(text);
  length += Buffer.byteLength(text);
  const out = Buffer.allocUnsafe(length);
  let offset = 0;
  for (const piece of pieces) offset += out.write(piece, offset);
  return out;
}

/**
 * A command whose bytes are encoded once, when it is made (see the module
 * comment). Its `args` are left empty (they would be 600 strings kept twice):
 * ioredis reads them only for subscribe replies, `SELECT`, its debug log and
 * its tracing, which then show the command without its arguments.
 *
 * @example
 * const [[error, added]] = await sendInOrder(client, [new EncodedCommand('EVALSHA', [sha, 1, stream, ...values])]);
 */
export class EncodedCommand extends Command {
  readonly #bytes: Buffer;

  constructor(name: string, args: readonly (string | number)[]) {
    super(name, []);
    this.#bytes = respOf(name, args);
  }

  override toWritable(): Buffer {
    return this.#bytes;
  }
}

/** A settled reply: the error, or null and the reply. */
export type Settled = [Error | null, unknown];

const settled = (reply: unknown): Settled => [null, reply];
const refused = (error: unknown): Settled => [error instanceof Error ? error : new Error(String(error)), null];

/**
 * Sends `commands` on `client`'s connection in order, in one write (the socket
 * corked while they are queued), and resolves with each one's reply or error,
 * in order, once all are in. ioredis's `Pipeline` would copy the commands'
 * Buffers into one first (a batch of 1,000 of the relay's events is about
 * 500 KB); this writes them as they are (what it bought: docs/BENCHMARKS.md,
 * session 30). A command on a connection that is not ready fails at once
 * (mailroom's clients have no offline queue).
 *
 * @example
 * const replies = await sendInOrder(client, calls); // [[null, 100], [error, null], …]
 */
export function sendInOrder(client: Redis, commands: readonly Command[]): Promise<Settled[]> {
  const socket = client.stream;
  socket.cork();
  try {
    return Promise.all(commands.map((command) => (client.sendCommand(command) as Promise<unknown>).then(settled, refused)));
  } finally {
    socket.uncork();
  }
}
