/* towerpack: the umbrella header. Includes every public header of the
 * installed library; not models.h, the model zoo of tp-train and the
 * examples, which is built in the source tree only (libtowerpack_models,
 * not installed: include <towerpack/models.h> yourself there). */
#ifndef TOWERPACK_TOWERPACK_H
#define TOWERPACK_TOWERPACK_H

#include <towerpack/version.h>
#include <towerpack/status.h>
#include <towerpack/log.h>
#include <towerpack/clock.h>
#include <towerpack/tensor.h>
#include <towerpack/datapoint.h>
#include <towerpack/rng.h>
#include <towerpack/wire.h>
#include <towerpack/dataflow_spec.h>  /* + dataflow_lib.h, dataflow.h */
#include <towerpack/image.h>
#include <towerpack/device.h>
#include <towerpack/backend.h>
#include <towerpack/optim.h>
#include <towerpack/graph.h>
#include <towerpack/checkpoint.h>
#include <towerpack/stats.h>
#include <towerpack/actor.h>
#include <towerpack/supervisor.h>
#include <towerpack/actor_dataflow.h>
#include <towerpack/security.h>
#include <towerpack/fileio.h>
#include <towerpack/process.h>
#include <towerpack/trainer_loop.h>
#include <towerpack/callback.h>
#include <towerpack/logdir.h>
#include <towerpack/plot.h>
#include <towerpack/input.h>
#include <towerpack/launch.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/predict.h>
#include <towerpack/gan.h>
#include <towerpack/dist.h>
#include <towerpack/tensorpack.h>

#endif
