// crossintercom: start a turn when mail arrives for the session NAME below (written by
// `crossintercom setup opencode`; edit it there, not here). While a session is idle, one wait
// for mail runs: `crossintercom wait`, or, set up with --gateway, a long poll of the gateway's
// /wait with fetch (nothing of crossintercom installed here). When it hands over mail, that text
// (framed as another agent's words) becomes the session's next prompt, started with promptAsync
// so the plugin never holds a turn open. Mail that arrives while the session is busy is held for
// its next idle moment. A one-shot `opencode run` starts no wait (it ends as it would without
// crossintercom), and the wait ends with OpenCode however OpenCode ends. See
// docs/agents.md#opencode.
import { spawn } from "node:child_process";

const COMMAND = __COMMAND__;
const ENV = __ENV__;
const NAME = __NAME__;
const WAIT_S = __WAIT_S__;
// null, or the gateway's URL and the environment variable that holds its token.
const GATEWAY = __GATEWAY__;
const EXIT_MAIL = 0;
const EXIT_TIMEOUT = 6;
// A gateway not reached (or failing) is asked again after this long, while the session is idle.
const RETRY_MS = 5000;

__GATEWAY_POLL__

// `opencode run ...` answers its prompt and exits: the first word after the options is "run".
const oneShot = () => process.argv.slice(2).find((arg) => !arg.startsWith("-")) === "run";

export const CrossintercomMail = async ({ client }) => {
  const active = !oneShot();
  let disposed = false;
  let waiter = null; // the running wait: {stop()}
  let idle = null; // the idle session to wake, if any
  const held = []; // mail handed over while no session was idle

  const deliver = async (sessionID, text) => {
    try {
      await client.session.promptAsync({
        path: { id: sessionID },
        body: { parts: [{ type: "text", text }] },
      });
    } catch {
      held.push(text); // not accepted (the server is going away): kept for the next idle
    }
  };

  // A subagent's session (the task tool's) goes idle while its parent still works: not the
  // session to wake.
  const isSubagent = async (sessionID) => {
    try {
      const got = await client.session.get({ path: { id: sessionID } });
      return Boolean(got?.data?.parentID);
    } catch {
      return false;
    }
  };

  // How a wait ended: "mail" (its text), "again" (nothing came in time), "retry" (the gateway
  // was not reached), or anything else ("stop", "error"): the watch ends until the next idle.
  const ended = async (how, text) => {
    if (disposed) return;
    if (how === "mail") {
      if (idle !== null) {
        const id = idle;
        idle = null;
        await deliver(id, text);
      } else {
        held.push(text);
      }
    } else if (how === "again" && idle !== null) {
      wait(false); // keep waiting while the session stays idle
    } else if (how === "retry" && idle !== null) {
      setTimeout(() => idle !== null && wait(false), RETRY_MS).unref?.();
    }
  };

  const spawnWait = (replace, done) => {
    const args = [...COMMAND.slice(1), "wait", "--as", NAME, "--format", "text"];
    args.push("--timeout", String(WAIT_S), ...(replace ? ["--replace"] : []));
    const child = spawn(COMMAND[0], args, {
      // The lifeline ends the waiter when this OpenCode process ends, however it ends.
      env: { ...process.env, ...ENV, CROSSINTERCOM_HARNESS_PID: String(process.pid) },
      stdio: ["ignore", "pipe", "ignore"],
    });
    let out = "";
    child.stdout.setEncoding("utf8"); // a character split between two reads stays whole
    child.stdout.on("data", (chunk) => {
      out += chunk;
    });
    child.on("error", () => done("error", "")); // not startable: stay quiet rather than loop
    child.on("close", (code) => {
      if (code === EXIT_MAIL && out.trim()) done("mail", out);
      else done(code === EXIT_TIMEOUT ? "again" : "stop", "");
    });
    return {
      stop: () => {
        if (child.exitCode === null) child.kill("SIGTERM");
      },
    };
  };

  const wait = (replace) => {
    if (!active || disposed || waiter !== null) return;
    let self = null;
    const done = async (how, text) => {
      if (waiter !== self) return;
      waiter = null;
      await ended(how, text);
    };
    self = GATEWAY === null ? spawnWait(replace, done) : pollGateway(GATEWAY, WAIT_S, done);
    waiter = self;
  };

  return {
    event: async ({ event }) => {
      if (!active || disposed) return;
      const props = event.properties ?? {};
      if (event.type === "session.idle") {
        const id = props.sessionID ?? event.sessionID;
        if (await isSubagent(id)) return;
        if (held.length > 0) {
          await deliver(id, held.splice(0).join("\n\n"));
          return;
        }
        idle = id;
        wait(true);
      } else if (event.type === "session.status" && props.status?.type === "busy") {
        if (props.sessionID === undefined || props.sessionID === idle) idle = null;
      }
    },
    dispose: async () => {
      disposed = true;
      const running = waiter;
      waiter = null;
      if (running !== null) running.stop();
    },
  };
};
