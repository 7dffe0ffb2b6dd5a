/* tp-worker: building a dataflow from a pipeline spec. */
#ifndef TP_WORKER_SPEC_H
#define TP_WORKER_SPEC_H
#include <towerpack/dataflow.h>
/* Parse `spec` into a new dataflow (caller owns). */
tp_status_t tp_worker_spec_dataflow(const char *spec, tp_dataflow_t **out);
#endif
