// An OAuth2 authorization server for the push authentication tests: oidc-provider (a certified
// implementation) granting client credentials on 127.0.0.1. Its access tokens are JWTs for one
// resource (the test subscriber), signed with keys published at /jwks, living `ttl_s` seconds;
// every token it issues is told on stdout ("issued <client_id>"), so a test counts fetches.
//
//   node tests/tools/oauth2-server.mjs PORT CONFIG.json
//   CONFIG: {"clients": [{client_id, client_secret, token_endpoint_auth_method?}],
//            "resource": "https://subscriber.test/", "ttl_s": 4}
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, configPath] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configPath, 'utf8'));

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: config.clients.map((c) => ({
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    token_endpoint_auth_method: 'client_secret_basic',
    ...c,
  })),
  scopes: ['push'],
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => config.resource,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'push',
        audience: config.resource,
        accessTokenTTL: config.ttl_s,
        accessTokenFormat: 'jwt',
      }),
    },
  },
  cookies: { keys: ['only-for-the-tests'] },
});

provider.on('client_credentials.issued', (token) => {
  console.log(`issued ${token.clientId}`);
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`oauth2 server listening on http://127.0.0.1:${port}`);
});
