"""Unit tests of the benchmark's parsing helpers (`make test` runs them; no gateway needed)."""

import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

# `perf stat -x , --per-thread` output: thread-tid, count, unit, event, run time, share, metric.
PERF_OUTPUT = """# started on Fri Nov 27 16:21:12 2026

brainstorm-7,3000000,,cycles:u,3634631728,100.00,,
sqlx-sqlite-wor-9,400000,,cycles:u,3634631728,100.00,,
sqlx-sqlite-wor-10,200000,,cycles:u,3634631728,100.00,,
sqlx-sqlite-wor-11,3,,cycles:u,3634631728,100.00,,
brainstorm-7,1500000,,instructions:u,3634907709,100.00,0.50,insn per cycle
sqlx-sqlite-wor-9,700000,,instructions:u,3634907709,100.00,1.75,insn per cycle
sqlx-sqlite-wor-10,200000,,instructions:u,3634907709,100.00,1.00,insn per cycle
brainstorm-7,1000000,,cycles:k,3635101439,100.00,,
sqlx-sqlite-wor-9,<not counted>,,cycles:k,0,0.00,,
brainstorm-7,250000,,instructions:k,3635229608,100.00,0.25,insn per cycle
"""


class CounterSplit(unittest.TestCase):
    def test_counts_per_request_by_thread_name(self):
        split = run.counter_split(PERF_OUTPUT, 10)
        gateway = split["threads"]["brainstorm"]
        self.assertEqual(gateway, {"cycles_user": 300000, "instructions_user": 150000, "cycles_kernel": 100000, "instructions_kernel": 25000, "ipc_user": 0.5})
        # Threads of one name are summed; a thread name may itself contain dashes.
        sqlite = split["threads"]["sqlx-sqlite-wor"]
        self.assertEqual((sqlite["cycles_user"], sqlite["instructions_user"], sqlite["cycles_kernel"]), (60000, 90000, 0))
        self.assertEqual(sqlite["ipc_user"], 1.5)
        self.assertEqual((split["cycles_user"], split["cycles_kernel"], split["instructions_user"]), (360000, 100000, 240000))

    def test_idle_threads_are_left_out(self):
        # A thread that spent fewer cycles than there were requests did no work in the phase.
        split = run.counter_split("idle-1,5,,cycles:u,1,100.00,,\nidle-1,5,,instructions:u,1,100.00,,\n", 10)
        self.assertEqual(split["threads"], {})
        self.assertEqual(split["cycles_user"], 0)



def annotated(total, *functions):
    """`callgrind_annotate --inclusive=yes` output of one dump: its total and some functions."""
    lines = [f"{total:,} (100.0%)  PROGRAM TOTALS", "", "Ir  file:function"]
    lines += [f"{total:,} (99.00%)  /src/x.rs:{function} [/bin/brainstorm]" for function in functions]
    return "\n".join(lines) + "\n"


class CallgrindThreads(unittest.TestCase):
    def test_each_dump_is_named_by_its_thread_code(self):
        self.assertEqual(run.callgrind_thread(annotated(5000, "std::rt::lang_start", "brainstorm::main")), ("requests", 5000))
        # The writers and the request thread send statements through sqlx too; only SQLite's own
        # threads run SQLite.
        writers = annotated(300, "brainstorm_audit_lineage::consumer::AuditConsumer::run::{{closure}}", "sqlx_sqlite::connection::worker::ConnectionWorker::execute")
        self.assertEqual(run.callgrind_thread(writers), ("writers", 300))
        sqlite = annotated(700, "sqlx_sqlite::connection::worker::ConnectionWorker::execute", "sqlite3_step", "sqlite3VdbeExec")
        self.assertEqual(run.callgrind_thread(sqlite), ("sqlite", 700))
        self.assertEqual(run.callgrind_thread(annotated(40, "start_thread")), ("other", 40))
        self.assertEqual(run.callgrind_thread("no totals here"), ("other", None))
        self.assertEqual(run.callgrind_thread(".           PROGRAM TOTALS (calculated)\n"), ("other", 0))

    def test_threads_of_a_kind_are_summed_per_request_and_idle_ones_left_out(self):
        dumps = [("requests", 5000), ("sqlite", 700), ("sqlite", 300), ("writers", 300), ("other", 9)]
        self.assertEqual(run.thread_split(dumps, 10), {"requests": 500, "sqlite": 100, "writers": 30})


class CountersAvailable(unittest.TestCase):
    def fake_perf(self, printed):
        """A `perf` that prints `printed` on stderr as `perf stat -x ,` would."""
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "perf")
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\ncat >&2 <<'END'\n" + printed + "END\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return path

    def test_counts_mean_available(self):
        printed = "".join(f"{count},,{event},1000,100.00,,\n" for count, event in zip((1, 2, 3, 4), run.COUNTER_EVENTS))
        self.assertTrue(run.counters_available(self.fake_perf(printed)))

    def test_a_vm_without_counters_is_not(self):
        printed = "".join(f"<not supported>,,{event},0,100.00,,\n" for event in run.COUNTER_EVENTS)
        self.assertFalse(run.counters_available(self.fake_perf(printed)))

    def test_no_perf_is_not(self):
        self.assertFalse(run.counters_available(None))


# `perf report --stdio -g none -n -t ;` output, sorted by `comm,dso` and by `sym`.
BY_THREAD_AND_OBJECT = """# Samples: 2K of event 'cpu-clock'
#
# Overhead;Samples;Command        ;Shared Object
 50.00% ;1000;brainstorm     ;brainstorm
 30.00% ;600;brainstorm     ;[kernel.kallsyms]
 10.00% ;200;sqlx-sqlite-wor;[kernel.kallsyms]
  5.00% ;100;brainstorm     ;libc.so.6
  5.00% ;100;brainstorm     ;[vdso]

"""
TOP_SYMBOLS = """# Overhead;Samples;Symbol
 20.00% ;400;[k] _raw_spin_unlock_irqrestore
  5.00% ;100;[.] __memmove_avx_unaligned_erms
  1.00% ;20;[.] serde_json::ser::format_escaped_str_contents; with a semicolon
"""


class TimeShares(unittest.TestCase):
    def test_shares_by_thread_and_kind_of_code_and_per_request(self):
        shares = run.time_shares(BY_THREAD_AND_OBJECT, TOP_SYMBOLS, "brainstorm", 200.0)
        self.assertEqual(shares["samples"], 2000)
        self.assertEqual(shares["threads_percent"], {"brainstorm": 90.0, "sqlx-sqlite-wor": 10.0})
        self.assertEqual(shares["kinds_percent"], {"kernel": 40.0, "program": 50.0, "libc": 5.0, "other": 5.0})
        self.assertEqual(list(shares["kinds_percent"]), ["program", "kernel", "libc", "other"])
        self.assertEqual(shares["kinds_us_per_request"], {"program": 100.0, "kernel": 80.0, "libc": 10.0, "other": 10.0})
        # A symbol may hold the separator: it is the last field, whole.
        self.assertEqual(
            shares["top_symbols_percent"],
            [
                ["[k] _raw_spin_unlock_irqrestore", 20.0],
                ["[.] __memmove_avx_unaligned_erms", 5.0],
                ["[.] serde_json::ser::format_escaped_str_contents; with a semicolon", 1.0],
            ],
        )

    def test_nothing_sampled_is_no_profile_and_an_unknown_cost_no_times(self):
        self.assertIsNone(run.time_shares("# Overhead;Samples;Command;Shared Object\n", "", "brainstorm", 100.0))
        self.assertIsNone(run.time_shares(BY_THREAD_AND_OBJECT, "", "brainstorm", None)["kinds_us_per_request"]["program"])

    def test_kinds_of_code(self):
        self.assertEqual(run.object_kind("[kernel.kallsyms]", "nginx"), "kernel")
        self.assertEqual(run.object_kind("nginx", "nginx"), "program")
        self.assertEqual(run.object_kind("libc.so.6", "nginx"), "libc")
        self.assertEqual(run.object_kind("[vdso]", "nginx"), "other")
        self.assertEqual(run.object_kind("brainstorm", "nginx"), "other")


class ProfilerAvailable(unittest.TestCase):
    def fake_perf(self, script):
        directory = tempfile.mkdtemp()
        path = os.path.join(directory, "perf")
        with open(path, "w") as handle:
            handle.write("#!/bin/sh\n" + script)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        return path

    def test_a_recording_means_available(self):
        # `perf record ... -o FILE -- true`: FILE is the argument after -o.
        writes = self.fake_perf('while [ "$1" != "-o" ]; do shift; done; touch "$2"\n')
        self.assertTrue(run.profiler_available(writes, tempfile.mkdtemp()))

    def test_a_refusal_or_no_perf_means_unavailable(self):
        self.assertFalse(run.profiler_available(self.fake_perf("echo 'not allowed' >&2; exit 255\n"), tempfile.mkdtemp()))
        self.assertFalse(run.profiler_available(None, tempfile.mkdtemp()))

class StackFloor(unittest.TestCase):
    def test_cpu_above_the_stack_per_phase_and_none_where_unmeasured(self):
        cpu = {"stack_axum_rate_2000": 87.5, "e_full_gateway": 210.0, "b_rate_2000_gateway": None}
        above = run.cpu_above(cpu, "stack_axum_rate_2000", {"full": "e_full_gateway", "up": "b_rate_2000_gateway", "edge": "h_edge_rate_2000"})
        self.assertEqual(above, {"full": 122.5, "up": None, "edge": None})
        self.assertEqual(run.cpu_above({"e_full_gateway": 210.0}, "stack_axum_rate_2000", {"full": "e_full_gateway"}), {"full": None})

    def test_a_missing_or_unbuilt_relay_is_not_executable(self):
        with tempfile.TemporaryDirectory() as directory:
            relay = os.path.join(directory, "stack-relay")
            self.assertFalse(run.executable(None))
            self.assertFalse(run.executable(relay))
            with open(relay, "w") as handle:
                handle.write("#!/bin/sh\n")
            self.assertFalse(run.executable(relay))
            os.chmod(relay, stat.S_IRWXU)
            self.assertTrue(run.executable(relay))
            self.assertFalse(run.executable(directory))



class PacedStreamEvents(unittest.TestCase):
    """The events of one paced stream, read from a stand-in upstream on loopback."""

    def serve(self, status, body):
        import http.server
        import threading

        seen = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the standard library's name)
                seen["path"] = self.path
                seen["body"] = self.rfile.read(int(self.headers["content-length"]))
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    def test_counts_event_lines_and_asks_for_the_model_without_its_provider(self):
        stream = b"event: message_start\ndata: {}\n\nevent: content_block_delta\ndata: {\"x\": \"event: no\"}\n\nevent: message_stop\ndata: {}\n\n"
        base, seen = self.serve(200, stream)
        self.assertEqual(run.paced_stream_events(base, {"model": "anthropic/claude-haiku-4-5", "stream": True}), 3)
        self.assertEqual(seen["path"], "/v1/messages")
        self.assertIn(b'"model": "claude-haiku-4-5"', seen["body"])

    def test_a_refusal_or_no_upstream_counts_nothing(self):
        base, _ = self.serve(500, b"no")
        self.assertIsNone(run.paced_stream_events(base, {"model": "anthropic/x"}))
        self.assertIsNone(run.paced_stream_events("http://127.0.0.1:1", {"model": "anthropic/x"}))

class AgentRequest(unittest.TestCase):
    def test_keeps_the_full_requests_tool_first_and_adds_schemas_to_twelve(self):
        full = {"model": "openai/m", "messages": [{"role": "user", "content": "use a tool"}],
                "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}
        agent = run.agent_request(full)
        self.assertEqual(len(agent["tools"]), run.AGENT_TOOLS)
        self.assertEqual(agent["tools"][0], full["tools"][0], "the tool the mock calls and the firewall inspects")
        names = [tool["function"]["name"] for tool in agent["tools"]]
        self.assertEqual(len(set(names)), len(names))
        self.assertEqual([message["role"] for message in agent["messages"]], ["system", "user"])
        self.assertEqual(agent["model"], full["model"])
        self.assertGreater(len(run.json.dumps(agent)), 8000)
        self.assertEqual(len(full["tools"]), 1, "the full request is left as it was")


if __name__ == "__main__":
    unittest.main()
