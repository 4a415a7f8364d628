// An OpenID provider for the company sign-in tests: oidc-provider (a certified implementation)
// on 127.0.0.1, with its development sign-in pages (any password is right; the login names the
// account). Each account's groups are read from a JSON file at every token, so a test moves a
// person out of a group by rewriting the file.
//
//   node tests/tools/oidc-server.mjs PORT CONFIG.json
//   CONFIG: {"clients": [{client_id, client_secret, redirect_uris}], "accounts_file": PATH}
//   accounts file: {"ana": {"groups": ["payments-devs"]}, ...}
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, configPath] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configPath, 'utf8'));

function groupsOf(id) {
  const accounts = JSON.parse(readFileSync(config.accounts_file, 'utf8'));
  return (accounts[id] || { groups: [] }).groups;
}

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: config.clients.map((c) => ({
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    ...c,
  })),
  scopes: ['openid', 'offline_access', 'profile', 'groups'],
  claims: { openid: ['sub'], profile: ['preferred_username', 'name'], groups: ['groups'] },
  conformIdTokenClaims: false, // the ID token carries the claims its scopes grant
  features: { devInteractions: { enabled: true } },
  pkce: { required: () => true },
  issueRefreshToken: async () => true,
  rotateRefreshToken: false,
  ttl: { AccessToken: 600, IdToken: 600, RefreshToken: 3600, Grant: 3600, Session: 3600,
    Interaction: 600 },
  cookies: { keys: ['only-for-the-tests'] },
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, preferred_username: id, name: id, groups: groupsOf(id) }),
  }),
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`oidc-provider listening on http://127.0.0.1:${port}`);
});
