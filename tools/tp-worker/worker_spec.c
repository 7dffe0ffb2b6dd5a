/* tp-worker: the --spec path. The pipeline spec parser lives in dataflow/
 * (another module); until it is part of this build, --spec says so. */
#include <towerpack/status.h>
#include "tools/tp-worker/worker_spec.h"

tp_status_t tp_worker_spec_dataflow(const char *spec, tp_dataflow_t **out) {
    *out = NULL;
    return tp_error(TP_ERR_UNSUPPORTED,
                    "--spec '%s': this build has no pipeline spec parser yet; "
                    "use --plugin", spec);
}
