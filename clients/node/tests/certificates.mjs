// Test certificates made with the openssl CLI in a scratch directory: a CA (`ca.pem`), a server
// certificate for 127.0.0.1 (`server.pem`, `server.key`) and a client certificate (`client.pem`,
// `client.key`) for mutual TLS, both signed by the CA.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * Makes the certificates; returns `dir`, `file(name)` (a path in it), `pem(name)` (its bytes)
 * and `remove()`.
 */
export function makeCertificates() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'turnwire-ts-tls-'));
  const openssl = (...args) =>
    execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  const ext =
    '[server]\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n[client]\nextendedKeyUsage=clientAuth\n';
  execFileSync('sh', ['-c', `printf '${ext}' > ext.cnf`], { cwd: dir });
  openssl(
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '1',
    '-subj',
    '/CN=turnwire-test-ca',
  );
  for (const name of ['server', 'client']) {
    openssl(
      'req',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      `${name}.key`,
      '-out',
      `${name}.csr`,
      '-subj',
      `/CN=${name}`,
    );
    openssl(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-days',
      '1',
      '-out',
      `${name}.pem`,
      '-extfile',
      'ext.cnf',
      '-extensions',
      name,
    );
  }
  const file = (name) => path.join(dir, name);
  return {
    dir,
    file,
    pem: (name) => readFileSync(file(name)),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}
