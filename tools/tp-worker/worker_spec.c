/* tp-worker: the --spec path, on the pipeline spec parser of dataflow/
 * when this build has it. */
#include <towerpack/actor_dataflow.h>
#include <towerpack/status.h>
#include "tools/tp-worker/worker_spec.h"
#if __has_include(<towerpack/dataflow_spec.h>)
#include <towerpack/dataflow_spec.h>

tp_status_t tp_worker_spec_dataflow(const char *spec, tp_dataflow_t **out) {
    *out = NULL;
    TP_TRY(tp_actor_spec_register());
    return tp_spec_parse(spec, out);
}
#else
tp_status_t tp_worker_spec_dataflow(const char *spec, tp_dataflow_t **out) {
    *out = NULL;
    return tp_error(TP_ERR_UNSUPPORTED,
                    "--spec '%s': this build has no pipeline spec parser yet; "
                    "use --plugin", spec);
}
#endif
