// train_fashion_mnist: data-parallel training of a 784-512-256-10 MLP on the real Fashion-MNIST
// (Debian's dataset-fashion-mnist) with gradient compression through gradzip's Reducer.
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bin/train_fashion_mnist
//       --spec topk:ratio=0.01,ef=on --epochs 5 --csv topk.csv      (one command line)
//
// Every rank loads the data, builds the same model from the seed, and trains on its slice of
// each global batch (examples/fashion_mnist/trainer.h); backward marks each layer ready as soon
// as its gradients exist, so the Reducer compresses and sends them while the layers below are
// still computing. After every epoch rank 0 prints, and writes to --csv, the train loss, the
// test loss and accuracy on the 10,000 test images, the bytes this rank has sent so far and
// the compression ratio.
//
// Options (defaults in brackets):
//   --data DIR        the four IDX files [$GRADZIP_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist]
//   --spec SPEC       the Reducer's model spec [none]
//   --epochs N [5]  --batch GLOBAL_BATCH [240]  --lr LR [0.1]  --momentum M [0.9]  --seed S [1]
//   --schedule cosine|constant   the learning rate over the run [cosine: from LR down to 0]
//   --momentum-correction on|off  each rank's momentum goes through the Reducer (DGC) [off]
//   --max-steps N     stop after N steps in all [no limit]
//   --lanes L         the Reducer's communication threads [2]
//   --csv FILE        rank 0 writes one row per epoch [none]
//   --label NAME      the CSV's label column [the spec]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "examples/fashion_mnist/idx.h"
#include "examples/fashion_mnist/mlp.h"
#include "examples/fashion_mnist/trainer.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace {

using gradzip::examples::EpochReport;
using gradzip::examples::TrainOptions;

struct Arguments {
  TrainOptions train;
  std::string data = gradzip::examples::default_fashion_mnist_dir();
  std::string csv;
  std::string label;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "train_fashion_mnist: %s\n(see the options at the top of examples/train_fashion_mnist.cpp)\n",
               message.c_str());
  std::exit(2);
}

double parse_number(std::string_view flag, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0)) {
    usage_error(std::string(flag) + " needs a non-negative number, got '" + text + "'");
  }
  return value;
}

std::size_t parse_whole(std::string_view flag, const char* text) {
  const double value = parse_number(flag, text);
  if (value != static_cast<double>(static_cast<std::size_t>(value))) {
    usage_error(std::string(flag) + " needs a whole number, got '" + text + "'");
  }
  return static_cast<std::size_t>(value);
}

bool parse_switch(std::string_view flag, const char* text) {
  const std::string_view value = text;
  if (value == "on") return true;
  if (value == "off") return false;
  usage_error(std::string(flag) + " takes on or off, got '" + text + "'");
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) usage_error(std::string(flag) + " needs a value");
    const char* value = argv[++i];
    if (flag == "--data") args.data = value;
    else if (flag == "--spec") args.train.spec = value;
    else if (flag == "--epochs") args.train.epochs = parse_whole(flag, value);
    else if (flag == "--batch") args.train.global_batch = parse_whole(flag, value);
    else if (flag == "--lr") args.train.lr = static_cast<float>(parse_number(flag, value));
    else if (flag == "--momentum") args.train.momentum = static_cast<float>(parse_number(flag, value));
    else if (flag == "--seed") args.train.seed = parse_whole(flag, value);
    else if (flag == "--schedule") args.train.schedule = value;
    else if (flag == "--momentum-correction") args.train.momentum_correction = parse_switch(flag, value);
    else if (flag == "--max-steps") args.train.max_steps = parse_whole(flag, value);
    else if (flag == "--lanes") args.train.lanes = static_cast<int>(parse_whole(flag, value));
    else if (flag == "--csv") args.csv = value;
    else if (flag == "--label") args.label = value;
    else usage_error("unknown option " + std::string(flag));
  }
  if (args.label.empty()) args.label = args.train.spec;
  return args;
}

// The CSV's text field: quoted when it holds a comma or a quote.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

int run(int argc, char** argv) {
  const Arguments args = parse(argc, argv);
  gradzip::Communicator communicator = gradzip::Communicator::world();
  const bool leader = communicator.rank() == 0;
  const gradzip::examples::ImageSet train = gradzip::examples::load_fashion_mnist(args.data, "train");
  const gradzip::examples::ImageSet test = gradzip::examples::load_fashion_mnist(args.data, "t10k");
  gradzip::examples::Mlp model({train.rows * train.cols, 512, 256, 10}, args.train.seed);

  std::ofstream csv;
  if (leader && !args.csv.empty()) {
    csv.open(args.csv);
    if (!csv) GZ_THROW(gradzip::ErrorCode::io_error, "train_fashion_mnist: cannot write ", args.csv);
    csv << "label,spec,ranks,epoch,step,train_loss,test_loss,test_accuracy,bytes_sent,"
           "compression_ratio,wall_seconds\n";
  }
  if (leader) {
    std::printf("fashion-mnist: %zu train / %zu test images, %d ranks, spec '%s', global batch %zu\n",
                train.count, test.count, communicator.size(), args.train.spec.c_str(),
                args.train.global_batch);
    std::printf("%6s %7s %10s %9s %9s %12s %7s %8s\n", "epoch", "step", "train_loss", "test_loss",
                "test_acc", "sent_bytes", "ratio", "time_s");
  }
  gradzip::examples::train(communicator, model, train, test, args.train, [&](const EpochReport& report) {
    if (!leader) return;
    std::printf("%6zu %7zu %10.4f %9.4f %8.2f%% %12llu %7.1f %8.1f\n", report.epoch, report.step,
                report.train_loss, report.test_loss, 100.0 * report.test_accuracy,
                static_cast<unsigned long long>(report.bytes_sent), report.compression_ratio,
                report.wall_seconds);
    std::fflush(stdout);
    if (csv.is_open()) {
      char numbers[256];
      std::snprintf(numbers, sizeof numbers, "%zu,%zu,%.6f,%.6f,%.6f,%llu,%.4f,%.3f", report.epoch,
                    report.step, report.train_loss, report.test_loss, report.test_accuracy,
                    static_cast<unsigned long long>(report.bytes_sent), report.compression_ratio,
                    report.wall_seconds);
      csv << csv_field(args.label) << ',' << csv_field(args.train.spec) << ',' << communicator.size()
          << ',' << numbers << '\n';
      csv.flush();
    }
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", error.what());
    // Other ranks may be waiting in a collective: end them all.
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
