// The gateway's long poll, as the Claude Code curl hook makes it (docs/agents.md#mcp-over-http):
// GET /wait answers with a key on its first line and the hand-over after it; POST
// /wait/shown?key=KEY marks that mail shown. The token comes from the environment variable
// gateway.tokenEnv and goes only into the Authorization header. Returns {stop()} at once and
// calls done(how, text) when the poll ends: "mail" (the text), "again" (nothing came in time),
// "retry" (the gateway not reached or failing), or "stop" (the token refused). A poll stopped
// before its confirmation confirms nothing, so its mail stays unseen; a confirmation that fails
// leaves it unseen too (handed again: shown twice rather than lost).
const pollGateway = (gateway, waitS, done) => {
  const abort = new AbortController();
  const { signal } = abort;
  const headers = { Authorization: `Bearer ${process.env[gateway.tokenEnv] ?? ""}` };
  const poll = async () => {
    const answer = await fetch(`${gateway.url}/wait?format=text&timeout=${waitS}`, {
      headers,
      signal,
    });
    const body = await answer.text();
    if (answer.status === 204) return ["again", ""];
    if (answer.status >= 400 && answer.status < 500) return ["stop", ""];
    if (answer.status !== 200) return ["retry", ""];
    const cut = body.indexOf("\n");
    const key = cut < 0 ? "" : body.slice(0, cut);
    const text = cut < 0 ? "" : body.slice(cut + 1);
    if (!/^[A-Za-z0-9_-]+$/.test(key) || !text.trim() || signal.aborted) return ["again", ""];
    try {
      const shown = `${gateway.url}/wait/shown?key=${encodeURIComponent(key)}`;
      await fetch(shown, { method: "POST", headers, signal });
    } catch {}
    return signal.aborted ? ["stop", ""] : ["mail", text];
  };
  poll().then(
    ([how, text]) => done(how, text),
    () => done("retry", ""),
  );
  return { stop: () => abort.abort() };
};
