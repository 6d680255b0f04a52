/* Where a crash in host code happened, on a machine without a debugger (the GPU machine has no
 * gdb). Preloaded into a process, it catches SIGSEGV, SIGBUS, SIGILL and SIGFPE and prints the
 * faulting address, the program counter as library + offset (and the nearest exported symbol),
 * a backtrace, and the stack words that point into a flashcore library (frames the unwinder
 * misses). Map an offset to source on the build machine with
 * `addr2line -f -C -e libflashcore.so 0xOFFSET` or `objdump -d --start-address=...`.
 *   gcc -O1 -g -shared -fPIC -o /tmp/libsegv_trace.so tools/segv_trace.c -ldl
 *   LD_PRELOAD=/tmp/libsegv_trace.so python3 crashing_script.py */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
#include <fcntl.h>

static void report(void *pc) {
    Dl_info info;
    if (dladdr(pc, &info) && info.dli_fname) {
        fprintf(stderr, "  %p  %s+0x%lx  (%s+0x%lx)\n", pc, info.dli_fname,
                (unsigned long)((char *)pc - (char *)info.dli_fbase),
                info.dli_sname ? info.dli_sname : "?",
                info.dli_saddr ? (unsigned long)((char *)pc - (char *)info.dli_saddr) : 0ul);
    } else {
        fprintf(stderr, "  %p  ?\n", pc);
    }
}

static void handler(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = (ucontext_t *)ctx;
    void *pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
    fprintf(stderr, "\n=== segv_trace: signal %d, fault address %p, pc:\n", sig, si->si_addr);
    report(pc);
    fprintf(stderr, "  rsp %p rbp %p rdi %p rsi %p rax %p\n", (void *)uc->uc_mcontext.gregs[REG_RSP],
            (void *)uc->uc_mcontext.gregs[REG_RBP], (void *)uc->uc_mcontext.gregs[REG_RDI],
            (void *)uc->uc_mcontext.gregs[REG_RSI], (void *)uc->uc_mcontext.gregs[REG_RAX]);
    void *frames[64];
    int n = backtrace(frames, 64);
    fprintf(stderr, "=== backtrace (%d frames):\n", n);
    for (int i = 0; i < n; i++) report(frames[i]);
    /* Raw stack words that point into loaded objects (frames without frame pointers). */
    fprintf(stderr, "=== stack words naming code:\n");
    void **sp = (void **)uc->uc_mcontext.gregs[REG_RSP];
    for (int i = 0; i < 256; i++) {
        Dl_info info;
        if (dladdr(sp[i], &info) && info.dli_fname && strstr(info.dli_fname, "flashcore")) report(sp[i]);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
}
