/* towerpack core: what decides whether forking is safe: the count of
 * threads declared safe to fork past, and the registry of states that make
 * a fork unsafe (registered by the rooms that create them, such as gpu's
 * CUDA module, so that the dataflows that fork need not know about them). */
#include <stdatomic.h>
#include <stddef.h>
#include <towerpack/process.h>

static atomic_int s_forksafe;
static _Atomic(const char *) s_hazard;

void tp_forksafe_threads_add(int n) { atomic_fetch_add(&s_forksafe, n); }

int tp_forksafe_threads(void) { return atomic_load(&s_forksafe); }

void tp_fork_hazard_set(const char *what) {
    /* The first hazard stays: it is the one that explains the refusal. */
    const char *none = NULL;
    atomic_compare_exchange_strong(&s_hazard, &none, what);
}

const char *tp_fork_hazard(void) { return atomic_load(&s_hazard); }
