/**
 * NATS headers handed to the client already written: `publish()` asks a
 * message's headers only for their bytes (`encode()`), so headers written as
 * text by the caller travel exactly as the client's own would, without a map
 * per message or the client's checks on each name.
 */
import { MsgHdrsImpl } from '@nats-io/transport-node';

/** Headers from their wire text (`NATS/1.0\r\nname: value\r\n...\r\n\r\n`), UTF-8 encoded once. */
export class EncodedHeaders extends MsgHdrsImpl {
  readonly #text: string;
  readonly #bytes: Uint8Array;

  /**
   * @example
   * nc.publish('orders.placed', body, { headers: new EncodedHeaders('NATS/1.0\r\nNats-Msg-Id: 42\r\n\r\n') });
   */
  constructor(text: string) {
    super();
    this.#text = text;
    this.#bytes = Buffer.from(text, 'utf8');
  }

  override encode(): Uint8Array {
    return this.#bytes;
  }

  override toString(): string {
    return this.#text;
  }
}
