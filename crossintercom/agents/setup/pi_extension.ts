// crossintercom: wake this Pi session when mail arrives for the session NAME below (written by
// `crossintercom setup pi`; edit it there, not here). In an interactive session (the TUI or RPC
// mode) one `crossintercom wait` runs at a time; when it prints mail, that text (framed as
// another agent's words) goes into the conversation as a crossintercom message, never as the
// user's, and starts a turn: at once when Pi is idle, after the current run when it is busy.
// One-shot runs (`pi --print`, `--mode json`) start nothing, so they end as they would without
// crossintercom. See docs/agents.md#pi.
import { spawn, type ChildProcess } from "node:child_process";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";

const COMMAND: string[] = __COMMAND__;
const ENV: Record<string, string> = __ENV__;
const NAME: string = __NAME__;
const WAIT_S: number = __WAIT_S__;
const EXIT_MAIL = 0;
const EXIT_TIMEOUT = 6;
// The modes that stay up waiting for their user; "print" and "json" end after their prompts.
const LIVE_MODES = new Set(["tui", "rpc"]);

export default function (pi: ExtensionAPI) {
  let live = false; // a session of this runtime is started and not shut down
  let waiter: ChildProcess | null = null;

  const stop = () => {
    live = false;
    const child = waiter;
    waiter = null;
    if (child !== null && child.exitCode === null) child.kill("SIGTERM");
  };

  const deliver = (text: string) => {
    try {
      pi.sendMessage(
        { customType: "crossintercom", content: text, display: true },
        { triggerTurn: true, deliverAs: "followUp" },
      );
    } catch {
      stop(); // this runtime is gone (reload, new session, exit): its successor waits instead
    }
  };

  // The first waiter takes over from one a previous Pi left behind; later ones do not, so a
  // newer Pi running as the same NAME keeps the mail instead of trading it back and forth.
  const wait = (replace: boolean) => {
    if (!live || waiter !== null) return;
    const args = [...COMMAND.slice(1), "wait", "--as", NAME, "--format", "text"];
    args.push("--timeout", String(WAIT_S), ...(replace ? ["--replace"] : []));
    const child = spawn(COMMAND[0], args, {
      // The lifeline ends the waiter when this Pi process ends, however it ends.
      env: { ...process.env, ...ENV, CROSSINTERCOM_HARNESS_PID: String(process.pid) },
      stdio: ["ignore", "pipe", "ignore"],
    });
    waiter = child;
    let out = "";
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      out += chunk;
    });
    child.on("error", () => {
      if (waiter === child) waiter = null; // not startable: stay quiet rather than loop
    });
    child.on("close", (code: number | null) => {
      if (waiter !== child) return;
      waiter = null;
      if (!live) return;
      if (code === EXIT_MAIL && out.trim()) {
        deliver(out);
        wait(false);
      } else if (code === EXIT_TIMEOUT) {
        wait(false);
      }
      // Anything else (another waiter holds NAME, an error) ends the watch for this session.
    });
  };

  pi.on("session_start", async (_event, ctx) => {
    if (!LIVE_MODES.has(ctx.mode)) return;
    live = true;
    wait(true);
  });

  pi.on("session_shutdown", async () => {
    stop();
  });
}
