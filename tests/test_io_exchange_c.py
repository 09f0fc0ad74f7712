"""csrc/io/exchange.c on its own: a C program over the subpartition queue, built
with AddressSanitizer + UBSan and with malloc wrapped so that a test can make
every allocation fail."""

import os
import shutil
import subprocess
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TERMINATE_CHECK = textwrap.dedent(r"""
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include "io/exchange.h"

    /* -Wl,--wrap=malloc: exchange.c's allocations come here. */
    void *__real_malloc(size_t n);
    static int fail_allocs, allocs;
    void *__wrap_malloc(size_t n)
    {
        allocs++;
        return fail_allocs ? NULL : __real_malloc(n);
    }

    #define CHECK(c) do { if (!(c)) { printf("FAILED line %d: %s\n", __LINE__, #c); \
                                      exit(1); } } while (0)

    static fb_item_t item(intptr_t v)
    {
        fb_item_t it = {(char *)v, NULL, 0, (v % 3) ? FB_ITEM_DATA : FB_ITEM_EVENT, (int32_t)v};
        return it;
    }

    /* Adds and polls following `ops` (a model FIFO alongside), then
     * terminates with every allocation failing: all queued items must come
     * back, oldest first, and nothing may be allocated. */
    static void run(const char *ops, unsigned seed)
    {
        fb_signal_t sig;
        fb_subpart_t sp;
        intptr_t model[4096];
        int head = 0, tail = 0;
        intptr_t next = 1;
        fb_item_t got, *items = NULL;
        int32_t n, k;
        CHECK(fb_signal_init(&sig) == FB_OK);
        CHECK(fb_subpart_init(&sp, &sig) == FB_OK);
        srand(seed);
        for (const char *p = ops; *p; p++) {
            int reps = *p == 'A' ? 1 + rand() % 9 : *p == 'P' ? 1 + rand() % 5 : 0;
            for (int r = 0; r < reps; r++) {
                if (*p == 'A') {
                    CHECK(fb_subpart_add(&sp, item(next), 0) == FB_OK);
                    model[tail++] = next++;
                } else if (head < tail) {
                    CHECK(fb_subpart_poll(&sp, &got) == FB_OK);
                    CHECK((intptr_t)got.data == model[head++]);
                }
            }
        }
        CHECK(fb_subpart_backlog(&sp) >= 0);
        fail_allocs = 1;
        allocs = 0;
        n = fb_subpart_terminate(&sp, FB_SP_RELEASED, &items);
        CHECK(allocs == 0);
        fail_allocs = 0;
        CHECK(n == tail - head);
        CHECK((n == 0) == (items == NULL));
        for (k = 0; k < n; k++) {
            CHECK((intptr_t)items[k].data == model[head + k]);
            CHECK(items[k].kind == item(model[head + k]).kind);
            CHECK(items[k].size == (int32_t)model[head + k]);
        }
        free(items);
        /* terminated: nothing is queued or taken any more */
        CHECK(fb_subpart_state(&sp) == FB_SP_RELEASED);
        CHECK(fb_subpart_backlog(&sp) == 0 && fb_subpart_size(&sp) == 0);
        CHECK(fb_subpart_add(&sp, item(1), 0) == FB_ERELEASED);
        CHECK(fb_subpart_poll(&sp, &got) == FB_ERELEASED);
        CHECK(fb_subpart_terminate(&sp, FB_SP_FAILED, &items) == 0 && items == NULL);
        CHECK(fb_subpart_state(&sp) == FB_SP_RELEASED);
        fb_subpart_free(&sp);
        fb_signal_free(&sig);
    }

    int main(void)
    {
        const char *shapes[] = {
            "", "A", "AP", "AAAA", "AAPAAPAA", "AAAAAAAAPPPAAAA", "APAPAPAPAPAPAPAP",
            "AAAAAAAAAAAAAAAAAAAAPPPPPPPPPPPPPAAAAAAAAA", "AAPPPPPPPAAAAAA",
        };
        for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (unsigned seed = 0; seed < 50; seed++)
                run(shapes[s], seed);
        printf("ok\n");
        return 0;
    }
""")


def test_terminating_a_subpartition_never_allocates(tmp_path):
    """fb_subpart_terminate copied the queue into a malloc'd array: when that
    failed inside ResultSubpartition.__dealloc__ the queued buffers leaked.
    It now hands over the queue's own storage, in FIFO order, whatever the
    ring's wrap-around and growth history."""
    cc = os.environ.get("CC", "gcc")
    assert shutil.which(cc), f"{cc} is needed to build the extension and this test"
    src, exe = tmp_path / "terminate_check.c", tmp_path / "terminate_check"
    src.write_text(TERMINATE_CHECK)
    build = subprocess.run(
        [cc, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-Icsrc", str(src), "csrc/io/exchange.c", "csrc/common/clock.c", "-Wl,--wrap=malloc",
         "-lpthread", "-lm", "-o", str(exe)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=1"
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
