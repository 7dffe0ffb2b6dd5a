/* towerpack core: the count of threads declared safe to fork past. */
#include <stdatomic.h>
#include <towerpack/process.h>

static atomic_int s_forksafe;

void tp_forksafe_threads_add(int n) { atomic_fetch_add(&s_forksafe, n); }

int tp_forksafe_threads(void) { return atomic_load(&s_forksafe); }
