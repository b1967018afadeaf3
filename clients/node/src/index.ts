// @turnwire/client: the TypeScript / Node.js client of the Turnwire sidecar (gRPC over HTTP/2).
// Browsers import "@turnwire/client/web" (Connect or gRPC-Web over fetch) instead. The generated
// messages and enums are under "@turnwire/client/gen/turnwire/v1/<file>_pb".

export * from './api.js';
export { TurnwireClient } from './client.js';
export type { Pem, TlsOptions, TurnwireClientOptions } from './client.js';
