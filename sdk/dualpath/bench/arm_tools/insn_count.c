/* A QEMU TCG plugin (plugin API version 1, as QEMU 7.2 loads it) that counts the guest
 * instructions a program executes, for `dualpath bench arm`.
 *
 *   qemu-aarch64 -plugin ./insn_count.so,out=FILE[,mode=total|tbs] PROGRAM ...
 *
 * When a translation block (TB) is translated, an inline add of its instruction count is
 * attached to it, so every execution of the block adds that many: an exact count for one
 * guest thread (the adds are not atomic, so threads running at the same time can lose
 * some; the file says how many threads the guest started, and the bench warns past one).
 *
 * mode=tbs also keeps a counter per block start address (guest virtual), each a counter
 * the block's own inline add writes, so the bench can attribute instructions to the
 * functions of the guest's files. A block ends at the first branch, so it lies inside one
 * function.
 *
 * At exit FILE holds:
 *   insns N          instructions executed, all threads
 *   threads T        guest threads (vCPUs) started, the main one included
 *   tb ADDR N        (mode=tbs) instructions executed in blocks starting at guest ADDR (hex)
 *
 * The declarations below are the few of QEMU's include/qemu/qemu-plugin.h this file uses,
 * written from its documentation: the plugin is built with the host's C compiler alone and
 * resolves these symbols in the qemu-aarch64 binary that loads it. */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* -- the plugin API (version 1) -------------------------------------------------------- */
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;

typedef struct {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_simple_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op, void *ptr,
                                              uint64_t imm);
void qemu_plugin_register_vcpu_init_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_simple_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);

EXPORT int qemu_plugin_version = 1;

/* -- the counters ---------------------------------------------------------------------- */
static uint64_t total_insns;      /* every block's inline add lands here */
static unsigned num_threads;      /* vCPUs initialized (guest threads started) */
static char out_path[4096];
static bool per_tb;

/* One block start address and the instructions executed from it. Entries never move once
 * made: an inline add holds a pointer to its counter for as long as the block lives (and
 * a block translated again at the same address adds to the same counter). */
typedef struct {
    uint64_t vaddr;
    uint64_t insns;
} tb_entry;

#define CHUNK_ENTRIES 65536
typedef struct chunk {
    struct chunk *next;
    size_t used;
    tb_entry e[CHUNK_ENTRIES];
} chunk;

static chunk *chunks;             /* newest first */
static tb_entry **index_slots;    /* open addressing over vaddr; NULL = empty */
static size_t index_size;         /* a power of two */
static size_t index_used;
static pthread_mutex_t index_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(uint64_t vaddr, size_t size) {
    uint64_t h = vaddr * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (size - 1);
}

static bool index_grow(void) {
    size_t size = index_size ? index_size * 2 : 1 << 16;
    tb_entry **slots = calloc(size, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < index_size; i++) {
        tb_entry *e = index_slots[i];
        if (!e) continue;
        size_t s = slot_of(e->vaddr, size);
        while (slots[s]) s = (s + 1) & (size - 1);
        slots[s] = e;
    }
    free(index_slots);
    index_slots = slots;
    index_size = size;
    return true;
}

/* The entry of `vaddr`, made on first use; NULL when memory runs out. */
static tb_entry *entry_for(uint64_t vaddr) {
    if ((index_used + 1) * 2 > index_size && !index_grow()) return NULL;
    size_t s = slot_of(vaddr, index_size);
    while (index_slots[s]) {
        if (index_slots[s]->vaddr == vaddr) return index_slots[s];
        s = (s + 1) & (index_size - 1);
    }
    if (!chunks || chunks->used == CHUNK_ENTRIES) {
        chunk *c = calloc(1, sizeof *c);
        if (!c) return NULL;
        c->next = chunks;
        chunks = c;
    }
    tb_entry *e = &chunks->e[chunks->used++];
    e->vaddr = vaddr;
    index_slots[s] = e;
    index_used++;
    return e;
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    const uint64_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &total_insns, n);
    if (!per_tb) return;
    pthread_mutex_lock(&index_lock);
    tb_entry *e = entry_for(qemu_plugin_tb_vaddr(tb));
    pthread_mutex_unlock(&index_lock);
    /* Out of memory: the block still counts in the total; the file's sum of tb lines then
     * falls short of it, which the bench reports as unattributed. */
    if (e) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &e->insns, n);
}

static void on_vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index) {
    (void)id;
    (void)vcpu_index;
    __atomic_fetch_add(&num_threads, 1, __ATOMIC_RELAXED);
}

static void write_counts(qemu_plugin_id_t id, void *userdata) {
    (void)id;
    (void)userdata;
    /* Written to a temporary name and renamed: a reader never sees half a file. */
    char tmp[sizeof out_path + 8];
    snprintf(tmp, sizeof tmp, "%s.part", out_path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "insn_count: cannot write %s\n", tmp);
        return;
    }
    fprintf(f, "insns %" PRIu64 "\nthreads %u\n", total_insns, num_threads);
    for (chunk *c = chunks; c; c = c->next)
        for (size_t i = 0; i < c->used; i++)
            if (c->e[i].insns) fprintf(f, "tb %" PRIx64 " %" PRIu64 "\n", c->e[i].vaddr, c->e[i].insns);
    if (fclose(f) != 0 || rename(tmp, out_path) != 0) fprintf(stderr, "insn_count: cannot write %s\n", out_path);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof out_path) {
            strcpy(out_path, argv[i] + 4);
        } else if (strcmp(argv[i], "mode=total") == 0) {
            per_tb = false;
        } else if (strcmp(argv[i], "mode=tbs") == 0) {
            per_tb = true;
        } else {
            fprintf(stderr, "insn_count: unknown argument %s (takes out=FILE and mode=total or mode=tbs)\n", argv[i]);
            return 1;
        }
    }
    if (!out_path[0]) {
        fprintf(stderr, "insn_count: no out=FILE argument: where the count goes\n");
        return 1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
    qemu_plugin_register_atexit_cb(id, write_counts, NULL);
    return 0;
}
